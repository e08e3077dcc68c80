"""Chapter 4 without a GPU: Triton's interpreter, chosen by the library without changing the process.

Triton's own switch, ``TRITON_INTERPRET``, is read whenever ``@triton.jit`` decorates a
function, so setting it late misses Triton's standard library (decorated at Triton's import,
which torch itself triggers), and setting it at import would change every other Triton
kernel in the process. So nothing here sets it unless asked:

- ``wanted()``: whether the course's kernels run interpreted (``TRITON_INTERPRET`` if set,
  else exactly when there is no CUDA GPU);
- ``interpreting(namespace)``: for one launch, the compiled functions of ``triton.language``
  and of ``namespace`` seen through interpreted copies, put back afterwards;
- ``use_interpreter()``: turn the interpreter on for a whole process, for a reader's own kernels.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import sys
import threading

import torch

ENV_VAR = "TRITON_INTERPRET"
_TRUE = ("1", "true", "yes", "on", "y")


def asked() -> bool | None:
    """What ``TRITON_INTERPRET`` asks for: True (``1``, ``true``, ...), False, or None when unset."""
    if ENV_VAR not in os.environ:
        return None
    return os.environ[ENV_VAR].strip().lower() in _TRUE


def wanted() -> bool:
    """Whether Triton kernels should run interpreted here: ``TRITON_INTERPRET`` when it is set
    (``1`` or ``0``), else exactly when no CUDA GPU is visible."""
    said = asked()
    return not torch.cuda.is_available() if said is None else said


def _jit_types():
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    squeeze_scalar_index()
    return JITFunction, InterpretedFunction


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as "3.6.0" or "2.4.0rc1"."""
    major, minor = (version.split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def scalar_index_broken() -> bool:
    """Whether this Triton's interpreter fails with this NumPy on a scalar used as an index.

    Triton 3.6's interpreter turns a scalar into a Python int with ``int(self.handle.data)``,
    where the data is a one-element array of one dimension; NumPy 2.4 made that conversion an
    error (deprecated since NumPy 1.25), so every kernel that loops over a computed range
    fails. Triton 3.7 squeezes the array first.
    """
    import numpy
    import triton

    return _release(triton.__version__) < (3, 7) and _release(numpy.__version__) >= (2, 4)


def squeeze_scalar_index() -> bool:
    """Where ``scalar_index_broken()``, make the interpreter's tensors convert to an int as
    Triton 3.7 does (``int(data.squeeze())``); returns whether the interpreter is fine now.

    Only the one attribute Triton's own patching sets wrongly is set again, by the same patch
    scope, so Triton puts it back with the rest after each launch. Nothing changes elsewhere.
    """
    if not scalar_index_broken():
        return True
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None:
        return False              # an interpreter laid out otherwise: reported by the registry
    if getattr(patch, "squeezes_scalars", False):
        return True

    def patch_lang_tensor(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    setattr(patch_lang_tensor, "squeezes_scalars", True)  # read back with getattr above
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True


def _stdlib_modules():
    import triton.language as tl
    # Launching imports Triton's gluon package on first use (argument specialization), and its
    # import checks that the standard library it wraps is compiled: import it before a swap.
    with contextlib.suppress(ImportError):
        import triton.experimental.gluon  # noqa: F401
    return (tl, tl.standard)


_copies: dict[int, tuple] = {}   # id of a compiled function -> (it, its interpreted copy)


def interpreted(kernel):
    """The interpreted copy of a compiled kernel (made once); anything else unchanged."""
    JITFunction, InterpretedFunction = _jit_types()
    if not isinstance(kernel, JITFunction):
        return kernel
    if id(kernel) not in _copies:
        _copies[id(kernel)] = (kernel, InterpretedFunction(kernel.fn))
    return _copies[id(kernel)][1]


def _swaps(namespaces) -> list[tuple[dict, str, object, object]]:
    """(namespace, name, compiled, interpreted) for each compiled function found there."""
    JITFunction, _ = _jit_types()
    return [(space, name, value, interpreted(value)) for space in namespaces
            for name, value in list(space.items()) if isinstance(value, JITFunction)]


_lock = threading.RLock()


@contextlib.contextmanager
def interpreting(namespace: dict | None = None):
    """Triton's standard library, and the compiled kernels in ``namespace`` (a module's
    globals), interpreted for the duration of the block. Where they already are (Triton
    imported with ``TRITON_INTERPRET=1``, or after ``use_interpreter``) nothing changes."""
    spaces = [vars(m) for m in _stdlib_modules()] + ([namespace] if namespace is not None else [])
    with _lock:
        saved = _language_state(namespace)
        try:
            for space, name, _, copy in _swaps(spaces):
                space[name] = copy
            yield
        finally:
            _restore(saved)


def _language_state(namespace: dict | None) -> list[tuple[object, dict]]:
    """(owner, its attributes) for everything an interpreted launch may leave changed.

    Triton's interpreter patches ``triton.language`` (its modules' builtins, ``tensor``'s and
    ``dtype``'s methods) for the functions it runs and does not put all of it back (an
    interpreted process never compiles). In a process that compiles too, a kernel compiled
    afterwards would meet patched builtins, so what was there is saved here and put back
    after the launch.
    """
    import triton.language as tl

    modules = [m for m in (tl, tl.core, tl.standard, tl.math, getattr(tl, "semantic", None))
               if inspect.ismodule(m)]
    classes = {c for m in modules for c in vars(m).values()
               if inspect.isclass(c) and c.__module__.startswith("triton.language")}
    owners = [*modules, *classes]
    state = [(owner, dict(vars(owner))) for owner in owners]
    if namespace is not None:
        state.append((namespace, dict(namespace)))
    return state


def _restore(state) -> None:
    for owner, saved in state:
        if isinstance(owner, dict) or inspect.ismodule(owner):
            # Names the interpreter added to a module stay: the functions it rewrote run in
            # that module's globals and read them (they shadow nothing a compile reads).
            (owner if isinstance(owner, dict) else vars(owner)).update(saved)
            continue
        now = vars(owner)
        for name in [n for n in now if n not in saved]:
            delattr(owner, name)
        for name, value in saved.items():
            if now.get(name, _MISSING) is not value and name not in ("__dict__", "__weakref__"):
                setattr(owner, name, value)


_MISSING = object()


def use_interpreter() -> bool:
    """Turn Triton's interpreter on for this whole process where there is no GPU; returns
    whether it is on.

    Sets ``TRITON_INTERPRET=1`` (so kernels decorated from now on are interpreted) and, if Triton
    was imported already, replaces its standard library with interpreted copies for good. Call
    it before defining kernels of your own. With a GPU it does nothing, unless
    ``TRITON_INTERPRET`` asks for the interpreter anyway.
    """
    if not wanted():
        return False
    os.environ[ENV_VAR] = "1"
    with contextlib.suppress(ImportError):
        squeeze_scalar_index()   # imports Triton; its standard library is interpreted as set above
    if "triton" in sys.modules:
        with _lock:
            for space, name, _, copy in _swaps([vars(m) for m in _stdlib_modules()]):
                space[name] = copy
    return True

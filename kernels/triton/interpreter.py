"""Chapter 4 without a GPU: what Triton's interpreter needs besides ``TRITON_INTERPRET=1``.

``kernels.triton`` sets ``TRITON_INTERPRET=1`` for the process where no GPU is visible, before
it defines its kernels. Two things that switch cannot reach are fixed here, once:

- ``interpret_standard_library()``: Triton imported before the switch was set (``torch.profiler``
  imports it) has its standard library (``tl.max``, ``tl.cdiv``, ...) compiled, which an
  interpreted kernel cannot call; interpreted copies replace it for the process.
- ``squeeze_scalar_index()``: Triton 3.6's interpreter with NumPy 2.4 fails on a scalar used
  as an index (see ``scalar_index_broken``).
"""
from __future__ import annotations

import contextlib
import os
import sys

from packaging.version import Version

ENV_VAR = "TRITON_INTERPRET"
_TRUE = ("1", "true", "yes", "on", "y")    # the values Triton's own knob reads as on


def asked() -> bool | None:
    """What ``TRITON_INTERPRET`` asks for: True (``1``, ``true``, ...), False, or None when unset."""
    if ENV_VAR not in os.environ:
        return None
    return os.environ[ENV_VAR].strip().lower() in _TRUE


def scalar_index_broken() -> bool:
    """Whether this Triton's interpreter fails with this NumPy on a scalar used as an index.

    Triton 3.6's interpreter turns a scalar into a Python int with ``int(self.handle.data)``,
    where the data is a one-element array of one dimension; NumPy 2.4 made that conversion an
    error (deprecated since NumPy 1.25), so every kernel that loops over a computed range
    fails. Triton 3.7 squeezes the array first.
    """
    import numpy
    import triton

    return (Version(triton.__version__).release[:2] < (3, 7)
            and Version(numpy.__version__).release[:2] >= (2, 4))


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
        return False              # an interpreter laid out otherwise: reported by kernels.compat
    if getattr(patch, "squeezes_scalars", False):
        return True

    def patch_lang_tensor(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    setattr(patch_lang_tensor, "squeezes_scalars", True)  # read back with getattr above
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True


def interpret_standard_library() -> None:
    """Replace the compiled functions of Triton's standard library with interpreted copies, for
    the process. Needed only where Triton was imported before ``TRITON_INTERPRET=1`` was set;
    where it was imported after, they are interpreted already and nothing changes."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    # Launching imports Triton's gluon package on first use, and its import checks that the
    # standard library it wraps is compiled: import it before the swap.
    with contextlib.suppress(ImportError):
        import triton.experimental.gluon  # noqa: F401
    for module in (tl, tl.standard, tl.math):
        for name, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                setattr(module, name, InterpretedFunction(value.fn))


def unfixable_reason() -> str | None:
    """Why the interpreted kernels cannot run with the installed Triton and NumPy (Triton 3.6's
    interpreter with NumPy 2.4, where ``squeeze_scalar_index`` could not apply its fix), or None."""
    if not asked():
        return None           # compiled kernels: the interpreter is not used
    try:
        import numpy
        import triton
    except ImportError:
        return None           # a missing Triton is the implementation's own reason
    if squeeze_scalar_index():
        return None
    return (f"Triton {triton.__version__}'s interpreter cannot run kernels with NumPy {numpy.__version__}: "
            "it converts one-element arrays with int(), which NumPy 2.4 refuses, and this Triton's "
            "interpreter is laid out differently from the 3.6 release the library knows how to fix; "
            f"install 'numpy<2.4' or Triton 3.7 or newer ({sys.executable} -m pip install 'numpy<2.4')")

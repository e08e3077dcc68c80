"""The book's build tools, run from a checkout (not part of the installed library).

``layout`` (where the book and its notebooks are), ``convert`` (notebooks/*.py -> book/*.ipynb),
``execute`` (the papermill runner), ``cache`` (its execution cache), ``publish`` (traces and
their budgets), ``html`` (the Jupyter Book build) and ``sphinx_figures`` (a Sphinx transform).
"""

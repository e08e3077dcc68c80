"""What only one chapter's page needs: one module per chapter, named after it (``ch01_naive``...).

The subject packages (``attention``, ``trace``, ``triton``, ``cuda``, ``hw``, ``bench``,
``parallel``, the registry and the reference) are what a reader imports for their own traces
and kernels. A chapter's lesson checks, glued numbers, page tables and figures, and the branch
that reads the book's own GPU recording live here instead, beside the page that calls them,
so a newcomer can tell the course's subject from the book's scaffolding.
"""

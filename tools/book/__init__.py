"""The book build."""

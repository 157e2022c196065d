"""Sparse MLA decode attention over the store's slot table, and its torch reference."""

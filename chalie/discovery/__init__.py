"""Tool discovery: exact name, name keyword (Tantivy) and vector (HNSW) rungs."""

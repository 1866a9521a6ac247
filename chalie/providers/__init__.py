"""Language-model providers: the neutral exchange types, three wire formats, one HTTP client."""

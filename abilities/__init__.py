"""Built-in abilities, one module each; the registry collects them automatically."""

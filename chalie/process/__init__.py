"""The process and its home: data directory, config, logs, life, control, supervision."""

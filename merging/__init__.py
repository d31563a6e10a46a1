"""RAM Studio's merging library: checkpoint I/O, merge methods, the streaming engine, export, CLI."""

__version__ = "0.1.0"

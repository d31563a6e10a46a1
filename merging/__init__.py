"""RAM Studio's merging library: model references and checkpoint I/O, the changed/shared/unique rule, merge
methods and kernels, the streaming engine, the counting pass for global ρ, safe export and recipes."""

__version__ = "0.2.0"

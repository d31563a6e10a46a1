"""Data only: the bundled demo's models, results, grids and lm-eval task files (`assets/demo/`) and the README's
images. A package so that setuptools ships these files with the code; the demo's code is the `demo` package."""

"""Bundled assets: the demo models and their build (assets.demo), and images for the README."""

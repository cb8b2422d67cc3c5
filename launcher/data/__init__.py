"""Data ahead of training: tokenization into nanotron's Nanoset files (docs/data.md)."""

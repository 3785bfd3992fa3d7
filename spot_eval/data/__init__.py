"""The vendored benchmark test sets and training splits (the files beside `datasets.py`, DATA.md),
loaded offline with their checksums verified. Imports nothing of spot_eval."""

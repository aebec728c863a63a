"""The suffix drafter's store of earlier generations: suffix arrays, their file format, the locked store."""

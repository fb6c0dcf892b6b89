"""Saving tables: sok.dump / sok.load, the incremental dump, and Embedding Variables in TF1
meta graphs. Imports keras and the layers below (in practice optimizers, parallel, tables)."""

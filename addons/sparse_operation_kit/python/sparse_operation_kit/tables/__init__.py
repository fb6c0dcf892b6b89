"""Tables: the Embedding Variable (DeepRec options, hash table), sok.Variable's static table
and the placement of keys over ranks (tables), eviction, input validation and the distinct-key
declarations. Imports runtime and serving."""

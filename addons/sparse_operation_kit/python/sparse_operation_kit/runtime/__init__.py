"""Bottom layer: what every other part of SOK stands on. The compiled ops (_ops), every
TensorFlow internal (compat), the names shared with the C++ core (schema, initializers), the
process (context: sok.init, ranks; collectives; devices), the Keras and package versions.
Imports nothing else of the package."""

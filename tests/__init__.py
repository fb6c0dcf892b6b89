"""A package, so that pytest imports the tests under tests/python/ by their full dotted names
(tests.python.<subpackage>.test_*): test files of different subpackages may then share a basename,
and every test file imports the same tests.python.support."""

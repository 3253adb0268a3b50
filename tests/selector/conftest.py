"""Every selector test runs against both evaluators (ids ``c`` and ``py``)."""
from tests.twins import twin_fixture

evaluator = twin_fixture("pymq.selector._evaluator_py", "pymq.selector._evaluator_c")

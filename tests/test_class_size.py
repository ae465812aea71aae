"""No class of the library or the kernels has more than 25 methods (read with ast, nothing imported).

A class that grows past that holds more than one job (SparseLinear once held eager, CUDA-graph, sharded,
compile and FP8 state in 47 methods): split the job out into the object it belongs to.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOST = 25


def method_counts(source: str) -> dict[str, int]:
    """{class name: functions defined directly in its body} (properties, setters, static and class methods
    count; nested classes are counted on their own)."""
    return {node.name: sum(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) for item in node.body)
            for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)}


def test_the_counter_counts_every_kind_of_method():
    source = ("class A:\n"
              "    x = 1\n"
              "    def f(self): pass\n"
              "    @property\n    def p(self): pass\n"
              "    @p.setter\n    def p(self, v): pass\n"
              "    @staticmethod\n    def s(): pass\n"
              "    async def a(self): pass\n"
              "    class B:\n        def g(self): pass\n")
    assert method_counts(source) == {"A": 5, "B": 1}


def test_no_class_has_more_than_25_methods():
    files = sorted((ROOT / "sparsity_lab").rglob("*.py")) + sorted((ROOT / "kernels").rglob("*.py"))
    assert len(files) > 50
    large = {f"{path.relative_to(ROOT)}::{name}": count for path in files
             for name, count in method_counts(path.read_text()).items() if count > MOST}
    assert not large, f"classes with more than {MOST} methods: {large}"

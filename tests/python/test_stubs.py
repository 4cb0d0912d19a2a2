"""The type stubs (python/bitrefit/_bitrefit.pyi) describe the module that was built (label python).

Every public name of the extension module is in the stubs and vice versa, every class member too,
and every function's parameter names and keyword-only marker equal those in the signature pybind11
puts at the top of its docstring. (No mypy on the build machine: this is the part of stubtest that
catches a stub falling behind the binding.)
"""
import ast
import pathlib
import re
import unittest

import bitrefit
from bitrefit import _bitrefit

STUBS = pathlib.Path(bitrefit.__file__).with_name("_bitrefit.pyi")
ALIASES = {"Tensor", "StateDict", "PathLike", "Progress", "Gate"}  # type aliases defined by the stubs only


def stub_tree():
    return ast.parse(STUBS.read_text())


def params_of_stub(fn):
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if a.kwonlyargs:
        names += ["*"] + [p.arg for p in a.kwonlyargs]
    return [n for n in names if n != "self"]


def params_of_doc(obj):
    line = obj.__doc__.splitlines()[0]
    inside = line[line.index("(") + 1: line.rindex(") ->")]
    names = []
    depth = 0
    token = ""
    for ch in inside + ",":
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            names.append(re.split(r"[:=]", token.strip())[0].strip())
            token = ""
        else:
            token += ch
    return [n for n in names if n and n != "self" and n != "*args"]


class Stubs(unittest.TestCase):
    def test_every_public_name_is_stubbed_and_exported(self):
        tree = stub_tree()
        stubbed = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        stubbed |= {t.id for n in tree.body if isinstance(n, ast.AnnAssign) for t in [n.target]}
        stubbed |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets}
        public = {n for n in dir(_bitrefit) if not n.startswith("_")} | {"__version__"}
        self.assertEqual(stubbed - ALIASES, public)
        self.assertEqual(set(bitrefit.__all__) | {"__version__"}, public)

    def test_functions_and_methods_have_the_modules_parameters(self):
        for node in stub_tree().body:
            if isinstance(node, ast.FunctionDef):
                self.assertEqual(params_of_stub(node), params_of_doc(getattr(_bitrefit, node.name)), node.name)
            if isinstance(node, ast.ClassDef) and not node.bases:
                cls = getattr(_bitrefit, node.name)
                members = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
                public = {n for n in dir(cls) if not n.startswith("_")} | {"__init__", "__enter__", "__exit__"}
                public = {n for n in public if hasattr(cls, n) and (not n.startswith("__") or n in cls.__dict__)}
                if not (cls.__init__.__doc__ or "").startswith("__init__("):  # pybind11's "no constructor"
                    public.discard("__init__")
                self.assertEqual(set(members), public, node.name)
                for name, fn in members.items():
                    attr = cls.__dict__[name]
                    if isinstance(attr, property) or name in ("__enter__", "__exit__"):
                        continue
                    self.assertEqual(params_of_stub(fn), params_of_doc(attr), node.name + "." + name)

    def test_error_classes_have_the_stubbed_bases(self):
        for node in stub_tree().body:
            if isinstance(node, ast.ClassDef) and node.bases:
                cls = getattr(_bitrefit, node.name)
                self.assertEqual([b.id for b in node.bases], [b.__name__ for b in cls.__bases__], node.name)


if __name__ == "__main__":
    unittest.main()

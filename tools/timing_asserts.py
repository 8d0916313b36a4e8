"""Find asserts that compare wall-clock timings without a device guard.

A timing comparison ("the fused loop is faster", "explicit attention is far slower") holds on
the device it was measured on, not on every device: on a GPU the order of two kernels can flip,
and an unsynchronised clock measures nothing at all. The book prints timings everywhere and
asserts them only under a guard that names the device, e.g.::

    if run.device.type == "cpu":
        assert t["loop"] > 2 * t["fused"], "..."

This checker reads notebooks' ``.py`` files (jupytext) with :mod:`ast`, without running them,
and reports every ``assert`` whose test *compares* a timing value and has no enclosing ``if``
(either branch) whose test reads a device type (``x.device.type``, ``device.type``,
``torch.cuda.is_available()``, ``torch.backends.mps.is_available()``, or a name ``device``
compared with a string). An ``or`` inside the assert that reads a device type also guards it
(``assert run.device.type != "cpu" or ratio > 2``).

Timing values are:

* calls of the timing helpers: ``interleaved_medians`` (``tfmlib.timing``) and the per-notebook
  helpers it replaces (``median_times``, ``best_ms``, ``time_gru``, ``ms_per_step``), and clock
  reads (``time.perf_counter()``, ``time.time()``, ``time.monotonic()``, ``perf_counter()``...);
* the wall-clock fields the package records: ``.seconds`` (``History``, ``TranslationReport``)
  and the ``"seconds"``/``"tokens_per_second"`` of fit's per-epoch records;
* names assigned from an expression that reads a timing (``seconds = {n: time_gru(..) for ..}``,
  ``ratio = seconds["a"] / seconds["b"]``), loop and comprehension variables that take timing
  values (``for name, t in timings.items()``, ``zip(timings["a"], timings["b"])``), containers a
  timing is appended or stored into (``times.setdefault(n, []).append(best_ms(..))``), functions
  that return one, and the keys of records that hold one (``dict(bleu=b, seconds=s)``: its
  ``"seconds"`` is a timing wherever that key is read, its ``"bleu"`` is not); repeated until
  nothing new is found.

Names follow Python's scopes (a function's names are its own; a comprehension's variables are
its own), with two simplifications: a loop over a bare name (``for name in timings``) is taken to
go over a dict's keys, which are not timings, and record keys are tracked file-wide. A check by
reading cannot follow every path a value takes (through an object's attributes, another module,
``eval``): it finds the timing comparisons written the way the book writes them, which its tests
cover.

Not comparisons of timings (never reported): a timing inside ``len()``, ``isinstance()``,
``type()`` or ``set()``, the ``device``/``repeats``/``warmup``/``number`` fields of a result, a
key that indexes a timing container (``times[name]``), strings, and comparisons only against the
literal ``0`` (a time is positive on every device).

Run ``python tools/timing_asserts.py [files]`` (default: ``notebooks/*.py`` and
``notebooks/solutions/*.py``): it prints ``file:line: assert ...`` for each finding and exits with
status 1 when there is any.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

TIMING_FUNCTIONS = frozenset({"interleaved_medians", "median_times", "best_ms", "time_gru", "ms_per_step"})
CLOCK_FUNCTIONS = frozenset({"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time",
                             "time_ns", "process_time"})
# the bare names of clocks imported with ``from time import ...`` (``time()`` alone is too common
# a name to be read as the clock unless it is ``time.time()``)
BARE_CLOCKS = frozenset({"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns"})
# wall-clock fields the package records: History.seconds, TranslationReport.seconds, and the
# "seconds" and "tokens_per_second" of fit's per-epoch records
TIMING_FIELDS = frozenset({"seconds", "tokens_per_second"})
NOT_A_VALUE_CALLS = frozenset({"len", "isinstance", "type", "set"})
NOT_A_VALUE_FIELDS = frozenset({"device", "repeats", "warmup", "number", "keys"})
CONTAINER_METHODS = frozenset({"append", "extend", "insert", "update", "setdefault", "add"})
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Finding:
    """An assert comparing timings without a device guard."""

    path: str
    line: int
    source: str
    names: tuple[str, ...]  # the timing names or helpers the comparison reads

    def __str__(self) -> str:
        via = f"  [timing: {', '.join(self.names)}]" if self.names else ""
        return f"{self.path}:{self.line}: {self.source}{via}"


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _is_clock_call(node: ast.Call) -> bool:
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "time":
        return func.attr in CLOCK_FUNCTIONS
    return isinstance(func, ast.Name) and func.id in BARE_CLOCKS


def _base_name(node: ast.expr) -> str | None:
    """``x`` for ``x``, ``x[i]``, ``x.attr``, ``x[i].attr[j]``."""
    while isinstance(node, (ast.Subscript, ast.Attribute, ast.Starred, ast.Call)):
        if isinstance(node, ast.Call):  # times.setdefault(name, []).append(t): the container is times
            if not isinstance(node.func, ast.Attribute):
                return None
            node = node.func
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _target_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _target_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)
    else:  # x[i] = ..., x.attr = ...: the container now holds a timing
        base = _base_name(target)
        if base is not None:
            yield base


Env = dict[str, bool]  # comprehension variables: name -> holds a timing (shadowing outer names)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _scope_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of a scope's body, without entering nested functions, lambdas or classes (whose
    names are their own); the nested definitions themselves are yielded."""
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, SCOPES):
            stack.extend(reversed(list(ast.iter_child_nodes(node))))


class _Scope:
    """A module or function body: the names it binds and which of them hold timings."""

    def __init__(self, node: ast.AST, parent: _Scope | None) -> None:
        self.node, self.parent = node, parent
        self.body: list[ast.stmt] = node.body if isinstance(node.body, list) else []
        self.timing: set[str] = set()
        self.bound: set[str] = set()
        declared_global: set[str] = set()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            self.bound |= {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x}
        for n in _scope_nodes(self.body):
            if isinstance(n, (ast.Global, ast.Nonlocal)):
                declared_global |= set(n.names)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                self.bound.add(n.id)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.bound.add(n.name)
        self.bound -= declared_global

    def owner(self, name: str) -> _Scope:
        """The scope a name belongs to (this one if it binds it, else the nearest enclosing one)."""
        scope: _Scope = self
        while name not in scope.bound and scope.parent is not None:
            scope = scope.parent
        return scope

    def holds_timing(self, name: str) -> bool:
        return name in self.owner(name).timing


class _Timings:
    """The timing names of every scope of one module, and its timing functions, to a fixed point."""

    def __init__(self, tree: ast.Module) -> None:
        self.functions: set[str] = set(TIMING_FUNCTIONS)
        self.keys: set[str] = set(TIMING_FIELDS)  # record keys that hold timings, file-wide
        self.module = _Scope(tree, None)
        self.scopes: dict[ast.AST, _Scope] = {tree: self.module}
        self._make_scopes(self.module)
        while self._grow():
            pass

    def _make_scopes(self, scope: _Scope) -> None:
        for n in _scope_nodes(scope.body):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                # a method does not see its class's names: its parent is the scope around the class
                child = _Scope(n, scope)
                self.scopes[n] = child
                self._make_scopes(child)
            elif isinstance(n, ast.ClassDef):
                for m in _scope_nodes(n.body):
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        child = _Scope(m, scope)
                        self.scopes[m] = child
                        self._make_scopes(child)

    # ------------------------------------------------------------------ what a value reads

    def reads(self, node: ast.AST, scope: _Scope, env: Env | None = None) -> list[str]:
        """The timing names, helpers and clocks that the value of ``node`` depends on."""
        found: list[str] = []
        self._collect(node, scope, env or {}, found)
        return found

    def _collect(self, node: ast.AST, scope: _Scope, env: Env, found: list[str]) -> None:
        record = None
        if isinstance(node, ast.Dict):
            record = node.values
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" \
                and not node.args:
            record = [k.value for k in node.keywords]
        if record is not None:  # a record is a timing only when all its fields are
            fields = [self.reads(v, scope, env) for v in record]
            if fields and all(fields):
                found.extend(name for f in fields for name in f)
            return
        if isinstance(node, ast.Call):
            name = _call_name(node.func)
            if isinstance(node.func, ast.Name) and name in NOT_A_VALUE_CALLS:
                return
            if name in self.functions:
                found.append(f"{name}()")
            elif _is_clock_call(node):
                found.append(f"time.{name}()" if isinstance(node.func, ast.Attribute) else f"{name}()")
        elif isinstance(node, ast.Attribute) and node.attr in NOT_A_VALUE_FIELDS:
            return
        elif isinstance(node, ast.Attribute) and node.attr in TIMING_FIELDS:
            found.append(f".{node.attr}")
            return
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if env[node.id] if node.id in env else scope.holds_timing(node.id):
                found.append(node.id)
            return
        elif isinstance(node, (ast.Lambda, ast.JoinedStr)):
            return  # a function that times is not a time; nor is a string
        elif isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value in self.keys:
                found.append(f"[{key.value!r}]")  # a record's timing field, whatever the record
            self._collect(node.value, scope, env, found)  # t["fast"] is a time; the key in t[name] is not
            return
        elif isinstance(node, COMPREHENSIONS):
            inner = self._comprehension_env(node, scope, env)
            parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for part in parts:
                self._collect(part, scope, inner, found)
            return
        for child in ast.iter_child_nodes(node):
            self._collect(child, scope, env, found)

    def _comprehension_env(self, node: ast.AST, scope: _Scope, env: Env) -> Env:
        """The comprehension's own variables (local to it), each marked timing or not."""
        inner = dict(env)
        for gen in node.generators:
            timing = set(self._loop_targets(gen.target, gen.iter, scope, inner))
            for name in _target_names(gen.target):
                inner[name] = name in timing
        return inner

    def _loop_targets(self, target: ast.expr, iterable: ast.expr, scope: _Scope, env: Env | None = None
                      ) -> list[str]:
        """The names that a loop over ``iterable`` binds to timing values. A loop over a bare name
        is taken to go over a dict's keys (``for name in timings``), which are not timings."""
        def reads(n: ast.AST) -> bool:
            return bool(self.reads(n, scope, env))

        pair = isinstance(target, (ast.Tuple, ast.List))
        if isinstance(iterable, ast.Name):  # for name in timings: the keys
            return []
        if isinstance(iterable, ast.Call):
            name = _call_name(iterable.func)
            method_of = iterable.func.value if isinstance(iterable.func, ast.Attribute) else None
            if name == "keys" and method_of is not None:
                return []
            if name == "values" and method_of is not None:
                return list(_target_names(target)) if reads(method_of) else []
            if name == "items" and method_of is not None:
                if pair and len(target.elts) == 2:
                    return list(_target_names(target.elts[1])) if reads(method_of) else []
                return list(_target_names(target)) if reads(method_of) else []
            if name == "zip" and pair and len(target.elts) == len(iterable.args):
                return [n for t, a in zip(target.elts, iterable.args, strict=True) if reads(a)
                        for n in _target_names(t)]
            if name == "enumerate" and iterable.args and pair and len(target.elts) == 2:
                return list(_target_names(target.elts[1])) if reads(iterable.args[0]) else []
        return list(_target_names(target)) if reads(iterable) else []

    def is_timing(self, node: ast.expr, scope: _Scope) -> bool:
        """Is this value a timing? A dict (``{...}`` or ``dict(k=v, ...)``), list, tuple or set
        written out is one only when every element is (``{"bleu": b, "seconds": s}`` is a record,
        not a timing)."""
        if isinstance(node, ast.Dict):
            return bool(node.values) and all(self.is_timing(v, scope) for v in node.values)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return bool(node.elts) and all(self.is_timing(e, scope) for e in node.elts)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" \
                and not node.args:  # dict(bleu=b, seconds=s): a record, like {...}
            return bool(node.keywords) and all(self.is_timing(k.value, scope) for k in node.keywords)
        return bool(self.reads(node, scope))

    def _assigned(self, target: ast.expr, value: ast.expr, scope: _Scope) -> list[str]:
        """The names that ``target = value`` binds to timing values."""
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
                and len(target.elts) == len(value.elts):
            return [n for t, v in zip(target.elts, value.elts, strict=True)
                    for n in self._assigned(t, v, scope)]
        return list(_target_names(target)) if self.is_timing(value, scope) else []

    def _record_keys(self, node: ast.AST, scope: _Scope) -> list[str]:
        """The keys of a record written out (``{"seconds": s, ...}``, ``dict(seconds=s, ...)``)
        whose values are timings."""
        if isinstance(node, ast.Dict):
            return [k.value for k, v in zip(node.keys, node.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str) and self.is_timing(v, scope)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            return [k.arg for k in node.keywords if k.arg and self.is_timing(k.value, scope)]
        return []

    # ------------------------------------------------------------------ the fixed point

    def _mark(self, scope: _Scope, names: Iterable[str]) -> bool:
        grew = False
        for name in names:
            owner = scope.owner(name)
            if name not in owner.timing:
                owner.timing.add(name)
                grew = True
        return grew

    def _grow(self) -> bool:
        grew = False
        for scope in self.scopes.values():
            for node in _scope_nodes(scope.body):
                for key in self._record_keys(node, scope):
                    if key not in self.keys:
                        self.keys.add(key)
                        grew = True
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                    if node.value is None:
                        continue
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        grew |= self._mark(scope, self._assigned(t, node.value, scope))
                elif isinstance(node, (ast.For, ast.AsyncFor)):
                    grew |= self._mark(scope, self._loop_targets(node.target, node.iter, scope))
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in CONTAINER_METHODS:
                    args = [*node.args, *(k.value for k in node.keywords)]
                    base = _base_name(node.func.value)
                    if base is not None and any(self.is_timing(a, scope) for a in args):
                        grew |= self._mark(scope, [base])
            node = scope.node
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in self.functions:
                returns = [n for n in _scope_nodes(node.body)
                           if isinstance(n, ast.Return) and n.value is not None]
                if any(self.is_timing(r.value, scope) for r in returns):
                    self.functions.add(node.name)
                    grew = True
        return grew

    # ------------------------------------------------------------------ comparisons in an assert

    def compared(self, node: ast.AST, scope: _Scope, env: Env | None = None) -> list[str]:
        """The timing values that comparisons inside ``node`` read (not against a literal 0 only)."""
        env = env or {}
        found: list[str] = []
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            reads = [self.reads(side, scope, env) for side in sides]
            others = [side for side, r in zip(sides, reads, strict=True) if not r]
            against_zero = others and all(isinstance(o, ast.Constant) and o.value == 0 for o in others)
            if any(reads) and not against_zero:  # "a time is positive" holds on every device
                found.extend(name for r in reads for name in r)
        if isinstance(node, COMPREHENSIONS):
            inner = self._comprehension_env(node, scope, env)
            parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            parts += [cond for gen in node.generators for cond in gen.ifs]
            for part in parts:
                found.extend(self.compared(part, scope, inner))
        elif not isinstance(node, (ast.Lambda, ast.JoinedStr)):
            for child in ast.iter_child_nodes(node):
                found.extend(self.compared(child, scope, env))
        return list(dict.fromkeys(found))


def _reads_device_type(test: ast.expr) -> bool:
    """Does this condition read a device type?"""
    for node in ast.walk(test):
        if isinstance(node, ast.Attribute) and node.attr == "type":
            inner = node.value
            if (isinstance(inner, ast.Attribute) and inner.attr == "device") or (
                    isinstance(inner, ast.Name) and "device" in inner.id):
                return True
        if isinstance(node, ast.Call) and _call_name(node.func) == "is_available":
            return True
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Name) and "device" in s.id for s in sides) and any(
                    isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides):
                return True
    return False


def _assert_guarded_inside(test: ast.expr) -> bool:
    """``assert <device check> or <claim>``: the assert carries its own guard."""
    return isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) and any(
        _reads_device_type(v) for v in test.values)


def check_source(source: str, path: str = "<source>") -> list[Finding]:
    """The unguarded timing asserts of one Python source text."""
    tree = ast.parse(source, filename=path)
    timings = _Timings(tree)
    lines = source.splitlines()
    findings: list[Finding] = []

    def visit(node: ast.AST, scope: _Scope, guarded: bool) -> None:
        if isinstance(node, ast.Assert):
            names = timings.compared(node.test, scope)
            if names and not guarded and not _assert_guarded_inside(node.test):
                text = lines[node.lineno - 1].strip() if node.lineno <= len(lines) else "assert"
                findings.append(Finding(path, node.lineno, text, tuple(names)))
            return
        if node in timings.scopes and node is not tree:
            scope = timings.scopes[node]
        if isinstance(node, ast.If):
            inner = guarded or _reads_device_type(node.test)
            for child in [*node.body, *node.orelse]:
                visit(child, scope, inner)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, scope, guarded)

    visit(tree, timings.module, False)
    return findings


def check_files(paths: Iterable[Path]) -> list[Finding]:
    """The unguarded timing asserts of each file (paths shown relative to the project when inside it)."""
    findings: list[Finding] = []
    for path in paths:
        path = Path(path)
        shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
        findings.extend(check_source(path.read_text(encoding="utf-8"), str(shown)))
    return findings


def notebook_sources(root: Path = ROOT) -> list[Path]:
    """The notebooks' ``.py`` files: ``notebooks/*.py`` and ``notebooks/solutions/*.py``."""
    return sorted([*(root / "notebooks").glob("*.py"), *(root / "notebooks" / "solutions").glob("*.py")])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    paths = [Path(a) for a in args] if args else notebook_sources()
    findings = check_files(paths)
    for f in findings:
        print(f)
    print(f"{len(findings)} timing assert(s) without a device guard in {len(paths)} file(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())

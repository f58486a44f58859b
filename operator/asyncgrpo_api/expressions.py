"""Cross-field rules written once, evaluated in Python and printed as CEL.

A rule is an expression over a job's spec, naming fields by their API paths relative to `spec`
(`trainer.asyncRL.maxStalenessVersions`). `evaluate` runs it on the spec as a dict with every
default filled in (the webhook, `asyncgrpo validate`, the trainer); `to_cel` prints it for the API
server (the chart's ValidatingAdmissionPolicy, asyncgrpo_api.admissionpolicy). Both judge a job by
the one definition, so they cannot drift apart the way two hand-written copies do.

The language holds what both sides compute alike: integers with + * %, comparisons of two values
of one type (doubles compared, never computed with), `in` a list of strings, `matches` an
anchored regular expression, booleans with & | ~, and `is_set()` for a field without a default.

`to_cel` also proves that the printed expression cannot fail when the API server evaluates it,
which is what lets the policy use failurePolicy Fail (an evaluation error would refuse the job):

- every field is tested with has() before it is read. A field without a default only where the
  rule itself tested `is_set()` first; the others (and every parent object) in a guard in front
  of the rule, which makes the rule not apply, rather than fail, on an object stored by an older
  CRD without that field;
- nullable fields are not read at all (CEL compares null with a number, cel-python does not);
- integer arithmetic stays within int64 for the bounds the CRD schema gives every operand, and
  `%` has a divisor of at least 1 and a dividend of at least 0 (where CEL's and Python's `%` agree).

An expression it cannot prove is refused when the policy is generated, naming the field.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Schema = Mapping[str, Any]
Type = Literal["int", "double", "string", "bool"]
INT64 = (-(2**63), 2**63 - 1)
_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_ARITHMETIC: dict[str, Callable[[int, int], int]] = {"+": operator.add, "*": operator.mul, "%": operator.mod}


class UnprovableError(ValueError):
    """The expression could fail (or differ from Python) when the API server evaluates it."""


class UnsetFieldError(LookupError):
    """`evaluate` read a field that is not set: the rule lacks an `is_set()` test."""


# --- the expressions ------------------------------------------------------------------------------


class Expr:
    """An expression; build them with `Field` and the operators and methods below."""

    def __and__(self, other: Expr) -> Expr:
        return And(_flatten(And, (self, other)))

    def __or__(self, other: Expr) -> Expr:
        return Or(_flatten(Or, (self, other)))

    def __invert__(self) -> Expr:
        return Not(self)

    def __add__(self, other: Expr | int) -> Expr:
        return Arithmetic("+", self, _lit(other))

    def __mul__(self, other: Expr | int) -> Expr:
        return Arithmetic("*", self, _lit(other))

    def __mod__(self, other: Expr | int) -> Expr:
        return Arithmetic("%", self, _lit(other))

    def eq(self, other: Expr | int | float | str | bool) -> Expr:
        return Comparison("==", self, _lit(other))

    def ne(self, other: Expr | int | float | str | bool) -> Expr:
        return Comparison("!=", self, _lit(other))

    def lt(self, other: Expr | int | float) -> Expr:
        return Comparison("<", self, _lit(other))

    def le(self, other: Expr | int | float) -> Expr:
        return Comparison("<=", self, _lit(other))

    def gt(self, other: Expr | int | float) -> Expr:
        return Comparison(">", self, _lit(other))

    def ge(self, other: Expr | int | float) -> Expr:
        return Comparison(">=", self, _lit(other))

    def is_in(self, values: Sequence[str]) -> Expr:
        return In(self, tuple(values))

    def matches(self, pattern: str) -> Expr:
        if not (pattern.startswith("^") and pattern.endswith("$")):
            raise ValueError(f"anchor the pattern with ^...$ (CEL's matches searches): {pattern!r}")
        re.compile(pattern)
        return Matches(self, pattern)


@dataclass(frozen=True, eq=False)
class Field(Expr):
    """A field of the spec by its API path, e.g. `trainer.grpo.numPromptsPerStep`."""

    path: str

    def is_set(self) -> Expr:
        return IsSet(self)


@dataclass(frozen=True, eq=False)
class Constant(Expr):
    value: int | float | str | bool


@dataclass(frozen=True, eq=False)
class IsSet(Expr):
    field: Field


@dataclass(frozen=True, eq=False)
class Not(Expr):
    operand: Expr


@dataclass(frozen=True, eq=False)
class And(Expr):
    operands: tuple[Expr, ...]


@dataclass(frozen=True, eq=False)
class Or(Expr):
    operands: tuple[Expr, ...]


@dataclass(frozen=True, eq=False)
class Comparison(Expr):
    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True, eq=False)
class Arithmetic(Expr):
    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True, eq=False)
class In(Expr):
    operand: Expr
    values: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Matches(Expr):
    operand: Expr
    pattern: str


def _lit(value: Expr | int | float | str | bool) -> Expr:
    return value if isinstance(value, Expr) else Constant(value)


def _flatten(kind: type[And] | type[Or], operands: tuple[Expr, ...]) -> tuple[Expr, ...]:
    out: list[Expr] = []
    for operand in operands:
        out.extend(operand.operands if isinstance(operand, kind) else (operand,))
    return tuple(out)


def fields(expr: Expr) -> Iterator[Field]:
    """Every field an expression reads or tests."""
    if isinstance(expr, Field):
        yield expr
    elif isinstance(expr, IsSet):
        yield expr.field
    elif isinstance(expr, Not):
        yield from fields(expr.operand)
    elif isinstance(expr, And | Or):
        for operand in expr.operands:
            yield from fields(operand)
    elif isinstance(expr, Comparison | Arithmetic):
        yield from fields(expr.left)
        yield from fields(expr.right)
    elif isinstance(expr, In | Matches):
        yield from fields(expr.operand)


# --- Python ---------------------------------------------------------------------------------------


def evaluate(expr: Expr, spec: Mapping[str, Any]) -> Any:
    """The expression's value for `spec` (a dict with defaults filled in, unset fields None)."""
    if isinstance(expr, Field):
        value = _lookup(spec, expr.path)
        if value is None:
            raise UnsetFieldError(f"{expr.path} is read but not set: test is_set() first")
        return value
    if isinstance(expr, Constant):
        return expr.value
    if isinstance(expr, IsSet):
        return _lookup(spec, expr.field.path) is not None
    if isinstance(expr, Not):
        return not evaluate(expr.operand, spec)
    if isinstance(expr, And):
        return all(evaluate(operand, spec) for operand in expr.operands)
    if isinstance(expr, Or):
        return any(evaluate(operand, spec) for operand in expr.operands)
    if isinstance(expr, Comparison):
        return _COMPARISONS[expr.op](evaluate(expr.left, spec), evaluate(expr.right, spec))
    if isinstance(expr, Arithmetic):
        return _ARITHMETIC[expr.op](evaluate(expr.left, spec), evaluate(expr.right, spec))
    if isinstance(expr, In):
        return evaluate(expr.operand, spec) in expr.values
    if isinstance(expr, Matches):  # ^...$ as RE2 reads it: `$` is the end, not a final newline
        return re.fullmatch(expr.pattern[1:-1], evaluate(expr.operand, spec)) is not None
    raise TypeError(f"not an expression: {expr!r}")


def _lookup(spec: Mapping[str, Any], path: str) -> Any:
    node: Any = spec
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def render(parts: Sequence[str | Expr], spec: Mapping[str, Any]) -> str:
    """A message made of text and expressions (integers and strings), for `spec`."""
    return "".join(part if isinstance(part, str) else str(evaluate(part, spec)) for part in parts)


# --- CEL ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldSchema:
    """What the CRD schema says about one field."""

    type: Type
    has_default: bool
    nullable: bool
    minimum: float | None
    maximum: float | None


_TYPES: dict[str, Type] = {"integer": "int", "number": "double", "string": "string", "boolean": "bool"}


def field_schema(spec_schema: Schema, path: str) -> FieldSchema:
    node = _schema_node(spec_schema, path)
    kind = _TYPES.get(str(node.get("type")))
    if kind is None:
        raise UnprovableError(f"{path}: only integer, number, string and boolean fields can be read")
    return FieldSchema(
        type=kind,
        has_default="default" in node,
        nullable=bool(node.get("nullable")),
        minimum=node.get("minimum"),
        maximum=node.get("maximum"),
    )


def _schema_node(spec_schema: Schema, path: str) -> Schema:
    node = spec_schema
    for part in path.split("."):
        properties = node.get("properties") or {}
        if part not in properties:
            raise UnprovableError(f"{path}: no such field in the CRD schema")
        node = properties[part]
    return node


@dataclass(frozen=True)
class Printer:
    """Prints expressions as CEL over `root` (e.g. `object.spec`), proving them safe."""

    spec_schema: Schema
    root: str

    def guarded(self, expr: Expr, *also: Expr) -> str:
        """`expr` behind has() tests of every parent object it reaches and of every field with a
        default it (or `also`, e.g. a message's parts) reads: false, not an error, without them."""
        guards: dict[str, None] = {}
        for item in (expr, *also):
            for field in fields(item):
                parts = field.path.split(".")
                for depth in range(1, len(parts)):
                    guards[".".join(parts[:depth])] = None
                if field_schema(self.spec_schema, field.path).has_default:
                    guards[field.path] = None
        tests = [f"has({self.root}.{path})" for path in guards]
        return " && ".join([*tests, self.cel(expr, frozenset())])

    def cel(self, expr: Expr, known: frozenset[str]) -> str:
        """CEL for `expr`, where the fields in `known` are set (tested by is_set() on the way)."""
        if isinstance(expr, Field):
            schema = self._readable(expr)
            if not schema.has_default and expr.path not in known:
                raise UnprovableError(f"{expr.path} has no default: test is_set() before reading it")
            return f"{self.root}.{expr.path}"
        if isinstance(expr, Constant):
            return _cel_literal(expr.value)
        if isinstance(expr, IsSet):
            self._readable(expr.field)
            return f"has({self.root}.{expr.field.path})"
        if isinstance(expr, Not):
            return f"!{self._operand(expr.operand, known)}"
        if isinstance(expr, And | Or):
            return self._logical(expr, known)
        if isinstance(expr, Comparison):
            left, right = self.type_of(expr.left), self.type_of(expr.right)
            if left != right:
                raise UnprovableError(f"comparing {left} with {right}: CEL has no such overload")
            return f"{self._operand(expr.left, known)} {expr.op} {self._operand(expr.right, known)}"
        if isinstance(expr, Arithmetic):
            self.interval(expr)
            return f"({self._operand(expr.left, known)} {expr.op} {self._operand(expr.right, known)})"
        if isinstance(expr, In):
            values = ", ".join(_cel_literal(v) for v in expr.values)
            return f"{self._operand(expr.operand, known)} in [{values}]"
        if isinstance(expr, Matches):
            return f"{self._operand(expr.operand, known)}.matches({_cel_literal(expr.pattern)})"
        raise TypeError(f"not an expression: {expr!r}")

    def message(self, parts: Sequence[str | Expr], known: frozenset[str]) -> str:
        """A CEL string expression for a message of text and integer or string expressions."""
        out = []
        for part in _joined_text(parts):
            if isinstance(part, str):
                out.append(_cel_literal(part))
                continue
            kind = self.type_of(part)
            if kind not in ("int", "string"):
                raise UnprovableError(f"a message shows integers and strings, not {kind}s")
            cel = self.cel(part, known)
            out.append(f"string({cel})" if kind == "int" else cel)
        return " + ".join(out)

    def _readable(self, field: Field) -> FieldSchema:
        schema = field_schema(self.spec_schema, field.path)
        if schema.nullable:
            raise UnprovableError(f"{field.path} is nullable: CEL implementations disagree on null")
        return schema

    def _operand(self, expr: Expr, known: frozenset[str]) -> str:
        text = self.cel(expr, known)
        return f"({text})" if isinstance(expr, And | Or | Comparison | In) else text

    def _logical(self, expr: And | Or, known: frozenset[str]) -> str:
        """Left to right, each operand knowing what the ones before it tested: in `a && b`, b is
        evaluated only when a is true; in `a || b`, only when a is false."""
        out = []
        for operand in expr.operands:
            out.append(self._operand(operand, known))
            known = known | (set_when(operand, isinstance(expr, And)))
        return (" && " if isinstance(expr, And) else " || ").join(out)

    def type_of(self, expr: Expr) -> Type:
        if isinstance(expr, Field):
            return field_schema(self.spec_schema, expr.path).type
        if isinstance(expr, Constant):
            value = expr.value
            if isinstance(value, bool):
                return "bool"
            return "int" if isinstance(value, int) else "double" if isinstance(value, float) else "string"
        if isinstance(expr, Arithmetic):
            if self.type_of(expr.left) != "int" or self.type_of(expr.right) != "int":
                raise UnprovableError("arithmetic is on integers only")
            return "int"
        return "bool"

    def interval(self, expr: Expr) -> tuple[int, int]:
        """The least and greatest value an integer expression takes within the schema's bounds."""
        if isinstance(expr, Constant) and isinstance(expr.value, int) and not isinstance(expr.value, bool):
            return expr.value, expr.value
        if isinstance(expr, Field):
            schema = field_schema(self.spec_schema, expr.path)
            if schema.type != "int" or schema.minimum is None or schema.maximum is None:
                raise UnprovableError(f"{expr.path} needs integer bounds in the schema to be computed with")
            return int(schema.minimum), int(schema.maximum)
        if isinstance(expr, Arithmetic):
            (a, b), (c, d) = self.interval(expr.left), self.interval(expr.right)
            if expr.op == "+":
                low, high = a + c, b + d
            elif expr.op == "*":
                products = (a * c, a * d, b * c, b * d)
                low, high = min(products), max(products)
            else:
                if c < 1 or a < 0:
                    raise UnprovableError("% needs a divisor of at least 1 and a dividend of at least 0")
                low, high = 0, d - 1
            if low < INT64[0] or high > INT64[1]:
                raise UnprovableError("integer arithmetic could overflow int64")
            return low, high
        raise UnprovableError(f"not an integer expression: {expr!r}")


def set_when(expr: Expr, outcome: bool) -> frozenset[str]:
    """Fields that `expr` having evaluated to `outcome` proves set."""
    if isinstance(expr, IsSet):
        return frozenset({expr.field.path}) if outcome else frozenset()
    if isinstance(expr, Not):
        return set_when(expr.operand, not outcome)
    if isinstance(expr, And) and outcome:
        return frozenset().union(*(set_when(operand, True) for operand in expr.operands))
    if isinstance(expr, Or) and not outcome:
        return frozenset().union(*(set_when(operand, False) for operand in expr.operands))
    return frozenset()


def _joined_text(parts: Sequence[str | Expr]) -> list[str | Expr]:
    """Adjacent pieces of text as one."""
    out: list[str | Expr] = []
    for part in parts:
        if isinstance(part, str) and out and isinstance(out[-1], str):
            out[-1] += part
        else:
            out.append(part)
    return out


def _cel_literal(value: int | float | str | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value)

"""Follow a value statically through mtpx's calls (Python's ast; nothing is imported or run).

    python tools/trace_value.py --root /work/base        # LLM.__init__'s num_speculative_tokens
    python tools/trace_value.py --root . --entry mtpx.engine.llm.LLM.__init__ --param k --json

The value is carried by: a tracked parameter; a local name bound to an expression that carries it
(`k = n`, `k = min(n, d)`, `for k in range(n + 1)`); `self.A` after the class (or an mtpx base) stored
it there (`self.A = k`; a dataclass-like class without `__init__` stores its fields); `X.A` where X
holds an object storing it in A. An expression carries it when any part does, except an if
expression's test, a lambda, and calls into mtpx (their results are objects: a call given the value or
a holder object returns a *holder*, e.g. `self.speculator = build_speculator(spec, model, k)`).

A call passes the value on when an argument carries it, or when an argument is a holder and the callee
reads the value out of that parameter (`engine.num_speculative_tokens`, `engine.runner.max_len`).
Callees resolve to definitions under ROOT/mtpx through imports and re-exports, `module.name`,
`ClassName(...)` (its `__init__`), `TABLE[key](...)` (a module-level dict of names), `super().m` and
`X.m` when X's class is known: `self`, a parameter's annotation or the holder class the caller bound
it to, `self.x` after `self.x = ClassName(...)`. A class that stores the value (or a holder) in
`self.A` passes it to each method of its own and its subclasses that reads the value through `self.A`
(an edge storer -> reader). The callee is analysed, again only when it gets a new parameter; the walk
repeats until nothing grows. Builtins and other packages are skipped; any other call passing the value
whose callee cannot be resolved is listed.

Modules are listed in first-visit order of the final depth-first walk (calls in source order). A
*return to a module higher up* is a call edge from module A to module B != A where B is above A: in a
higher layer of pyproject.toml's import-linter layers contract, or in the same layer and B imports A
(directly or through other mtpx modules; imports under `if TYPE_CHECKING:` excluded), so the value went
down the import order and comes back up to B. Counted as call edges and as distinct module pairs.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import json
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:     # Python 3.10
    import tomli as tomllib

FUNC = ast.FunctionDef


class Index:
    """ROOT/mtpx's modules: module-level definitions and dicts of names, imports, classes, layers."""

    def __init__(self, root: Path):
        self.defs, self.tables, self.imports = {}, {}, {}
        trees = {}
        for path in sorted((root / "mtpx").rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            trees[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = (ast.parse(path.read_text()), parts)
        for mod, (tree, parts) in trees.items():
            self.defs[mod] = {n.name: n for n in tree.body if isinstance(n, (FUNC, ast.ClassDef))}
            self.tables[mod] = {t.id: [v.id for v in n.value.values if isinstance(v, ast.Name)] for n in tree.body
                                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict)
                                for t in n.targets if isinstance(t, ast.Name)}
            imports = self.imports.setdefault(mod, {})
            package = mod if parts[-1] == "__init__" else mod.rpartition(".")[0]
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for a in node.names:
                        imports[a.asname or a.name.split(".")[0]] = ("module", a.name if a.asname
                                                                     else a.name.split(".")[0])
                elif isinstance(node, ast.ImportFrom):
                    src = ".".join(p for p in (package.rsplit(".", node.level - 1)[0] if node.level else "",
                                               node.module or "") if p)
                    for a in node.names:
                        imports[a.asname or a.name] = ("name", src, a.name)
        self.classes = {(m, n): d for m, ds in self.defs.items() for n, d in ds.items() if isinstance(d, ast.ClassDef)}
        contract = next(c for c in tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]
                        ["contracts"] if c["type"] == "layers")
        self.layer_of = {p.strip(): i for i, layer in enumerate(contract["layers"]) for p in layer.split("|")}

    def resolve(self, mod: str, name: str, depth: int = 0):
        """('def', mod, node) | ('module', mod) | ('table', mod, names) | ('external',) | None."""
        if name in self.defs.get(mod, {}):
            return ("def", mod, self.defs[mod][name])
        if name in self.tables.get(mod, {}):
            return ("table", mod, self.tables[mod][name])
        kind, *rest = self.imports.get(mod, {}).get(name, (None,))
        if kind == "module":
            return ("module", rest[0]) if rest[0] in self.defs else ("external",)
        if kind == "name" and depth < 10:
            if f"{rest[0]}.{rest[1]}" in self.defs:
                return ("module", f"{rest[0]}.{rest[1]}")
            return self.resolve(rest[0], rest[1], depth + 1) if rest[0] in self.defs else ("external",)
        return ("external",) if hasattr(builtins, name) else None

    def class_named(self, mod, expr):
        """The class key an annotation or a callee expression names (`C`, `"C"`, `C | None`), or None."""
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            expr = ast.parse(expr.value, mode="eval").body
        if isinstance(expr, ast.BinOp):
            return self.class_named(mod, expr.left) or self.class_named(mod, expr.right)
        r = self.resolve(mod, expr.id) if isinstance(expr, ast.Name) else None
        return (r[1], r[2].name) if r and r[0] == "def" and isinstance(r[2], ast.ClassDef) else None

    def bases(self, key):
        """key = (module, class name) and its mtpx base classes, nearest first."""
        out = [key]
        for b in self.classes[key].bases:
            found = self.class_named(key[0], b)
            out += [k for k in (self.bases(found) if found else []) if k not in out]
        return out

    def family(self, key):
        """key, its mtpx bases and its subclasses (which share self when key is a mixin)."""
        return self.bases(key) + sorted(k for k in self.classes if k != key and key in self.bases(k))

    def method(self, key, name):
        """The walk target (module, qualname, node, class key) of a method of key or its bases, or None."""
        for k in self.bases(key) if key else []:
            for n in self.classes[k].body:
                if isinstance(n, FUNC) and n.name == name:
                    return (k[0], f"{k[1]}.{name}", n, k)
        return None

    def target(self, mod, node):
        if isinstance(node, ast.ClassDef):
            return self.method((mod, node.name), "__init__") or (mod, node.name, node, (mod, node.name))
        return (mod, node.name, node, None)

    def layer(self, mod: str):
        """mod's layer in the import-linter layers contract (0: the top), None outside it."""
        return next((self.layer_of[p] for p in sorted(self.layer_of, key=len, reverse=True)
                     if mod == p or mod.startswith(p + ".")), None)


class Frame:
    """One function's analysis in a walk: which names and attributes carry the value or a holder."""

    def __init__(self, walk: Walk, t, dry: bool = False):
        self.w, self.ix, (self.mod, self.qual, self.node, self.ckey) = walk, walk.ix, t
        self.body = list(ast.walk(self.node)) if isinstance(self.node, FUNC) else []
        a = self.node.args if isinstance(self.node, FUNC) else None
        self.selfname = a.args[0].arg if self.ckey and a and a.args else None
        self.annotations = {p.arg: p.annotation for p in a.posonlyargs + a.args + a.kwonlyargs} if a else {}
        self.values, self.objects = set(walk.vparams.get(t[:2], ())), dict(walk.oparams.get(t[:2], {}))
        self.local_defs = {n.name for n in self.body if isinstance(n, FUNC) and n is not self.node}
        assigns = [(tg, n.value) for n in self.body if isinstance(n, ast.Assign) for tg in n.targets]
        self.locals = set(self.annotations) | {tg.id for tg, _ in assigns if isinstance(tg, ast.Name)}
        plain = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp, ast.Constant, ast.JoinedStr)
        self.builtin_typed = {tg.id for tg, v in assigns if isinstance(tg, ast.Name) and (isinstance(v, plain) or (
            isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in ("list", "dict", "set")))}
        self.stored, self.dry, self.typing = set(), dry, set()

    def _self_attr(self, e):
        return isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == self.selfname

    def carries(self, e) -> bool:
        if isinstance(e, ast.Name):
            return e.id in self.values
        if isinstance(e, ast.Attribute):
            if self._self_attr(e):
                return any((k, e.attr) in self.w.vhold for k in self.ix.family(self.ckey))
            return e.attr in self.w.vnames and self.holds(e.value)
        if isinstance(e, ast.IfExp):
            return self.carries(e.body) or self.carries(e.orelse)
        if isinstance(e, ast.Call):     # a builtin's result (min(k, d), range(k + 1)), a method's of it (ks.values())
            if isinstance(e.func, ast.Attribute) and self.carries(e.func.value):
                return not self.callees(e.func)
            return (isinstance(e.func, ast.Name) and e.func.id not in self.locals and hasattr(builtins, e.func.id)
                    and any(self.carries(x) for x in e.args + e.keywords))
        if isinstance(e, ast.Subscript):    # ks[0], not drafts[:k]
            return self.carries(e.value)
        return not isinstance(e, ast.Lambda) and any(self.carries(c) for c in ast.iter_child_nodes(e))

    def holds(self, e) -> bool:
        if isinstance(e, ast.Name):
            return e.id in self.objects or (e.id == self.selfname and any(
                k in self.ix.family(self.ckey) for k, _ in list(self.w.vhold) + list(self.w.ohold)))
        if isinstance(e, ast.Attribute):
            if self._self_attr(e):
                return any((k, e.attr) in self.w.ohold for k in self.ix.family(self.ckey))
            return e.attr in self.w.onames and self.holds(e.value)
        if isinstance(e, ast.IfExp):
            return self.holds(e.body) or self.holds(e.orelse)
        if isinstance(e, ast.Call):
            return bool(self.callees(e.func)) and any(self.carries(x) or self.holds(x) for x in e.args + e.keywords)
        return isinstance(e, ast.keyword) and self.holds(e.value)

    def class_of(self, e):
        """The mtpx class of an expression's object, where known, else None."""
        ix = self.ix
        if isinstance(e, ast.Name):
            if e.id == self.selfname:
                return self.ckey
            ann = self.annotations.get(e.id)
            if self.objects.get(e.id) or ann is not None:
                return self.objects.get(e.id) or ix.class_named(self.mod, ann)
            if e.id in self.typing:     # a cycle: unknown
                return None
            self.typing.add(e.id)      # a local: the class of what it was bound to (kv = engine.kv)
            found = next((c for n in self.body if isinstance(n, ast.Assign) and any(
                isinstance(x, ast.Name) and x.id == e.id for x in n.targets) if (c := self.class_of(n.value))), None)
            self.typing.discard(e.id)
            return found
        if isinstance(e, ast.Call):
            return ix.class_named(self.mod, e.func)
        cls = self.class_of(e.value) if isinstance(e, ast.Attribute) else None
        for k in ix.bases(cls) if cls else []:
            if self.w.ohold.get((k, e.attr)):
                return self.w.ohold[(k, e.attr)]
            for n in ast.walk(ix.classes[k]):     # self.x = C(...), x: C, self.x: C, a property -> C
                tg = n.targets if isinstance(n, ast.Assign) else [getattr(n, "target", None)]
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and any(
                        isinstance(x, ast.Attribute) and x.attr == e.attr for x in tg):
                    found = ix.class_named(k[0], n.value.func)
                elif isinstance(n, ast.AnnAssign) and getattr(tg[0], "attr", getattr(tg[0], "id", None)) == e.attr:
                    found = ix.class_named(k[0], n.annotation)
                elif isinstance(n, FUNC) and n.name == e.attr and n.returns is not None:
                    found = ix.class_named(k[0], n.returns)
                else:
                    continue
                if found:
                    return found
        return None

    def callees(self, func):
        """The walk targets a callee resolves to: [] for builtins and other packages, None if unknown."""
        ix = self.ix
        if isinstance(func, ast.Name):
            if func.id in self.local_defs:
                return []
            r = ix.resolve(self.mod, func.id)
            return [ix.target(r[1], r[2])] if r and r[0] == "def" else [] if r and r[0] == "external" else None
        if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name):
            r = ix.resolve(self.mod, func.value.id)
            found = [ix.resolve(r[1], n) for n in r[2]] if r and r[0] == "table" else []
            return [ix.target(x[1], x[2]) for x in found if x and x[0] == "def"] or None
        if not isinstance(func, ast.Attribute):
            return None
        v = func.value
        if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super" and self.ckey:
            found = next((m for b in ix.bases(self.ckey)[1:] if (m := ix.method(b, func.attr))), None)
            return [found] if found else None
        cls = self.class_of(v)
        if cls:      # on self, a mixin's method may be a subclass's
            found = ix.method(cls, func.attr) or (cls == self.ckey and next(
                (m for k in ix.family(cls) if (m := ix.method(k, func.attr))), None))
            return [found] if found else None
        if isinstance(v, ast.Constant) or (isinstance(v, ast.Name) and v.id in self.builtin_typed):
            return []       # a str's or a list's method
        root = v
        while isinstance(root, ast.Attribute):
            root = root.value
        r = ix.resolve(self.mod, root.id) if isinstance(root, ast.Name) and root.id not in self.locals else None
        if r and isinstance(v, ast.Name) and r[0] == "module":
            found = ix.resolve(r[1], func.attr)
            return [ix.target(found[1], found[2])] if found and found[0] == "def" else None
        if r and isinstance(v, ast.Name) and r[0] == "def" and isinstance(r[2], ast.ClassDef):
            found = ix.method((r[1], r[2].name), func.attr)
            return [found] if found else None
        return [] if r and r[0] == "external" else None

    def bind(self, tg, obj: bool = False, cls=None) -> None:
        if isinstance(tg, (ast.Tuple, ast.List)):
            for x in tg.elts:
                self.bind(x, obj, cls)
        elif isinstance(tg, ast.Starred):
            self.bind(tg.value, obj, cls)
        elif isinstance(tg, ast.Name) and obj:
            self.objects[tg.id] = self.objects.get(tg.id) or cls
        elif isinstance(tg, ast.Name):
            self.values.add(tg.id)
        elif self._self_attr(tg) and self.ckey and not self.dry:
            self.stored.add(tg.attr)
            if obj:
                self.w.ohold[(self.ckey, tg.attr)] = self.w.ohold.get((self.ckey, tg.attr)) or cls
                self.w.onames.add(tg.attr)
            else:
                self.w.vhold.add((self.ckey, tg.attr))
                self.w.vnames.add(tg.attr)

    def bind_locals(self) -> None:
        """Local names and self attributes bound to the value or a holder, to a fixpoint (order-free)."""
        for _ in range(len(self.body) + 1):
            before = (len(self.values), len(self.objects), self.w.size())
            for n in self.body:
                if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and n.value:
                    targets = getattr(n, "targets", None) or [n.target]
                    if isinstance(n.value, ast.Tuple) and all(isinstance(x, ast.Tuple) and len(x.elts) == len(
                            n.value.elts) for x in targets):      # a, b = x, y: element by element
                        pairs = [(x.elts[i], v) for x in targets for i, v in enumerate(n.value.elts)]
                    else:
                        pairs = [(x, n.value) for x in targets]
                    for tg, value in pairs:
                        if self.carries(value):
                            self.bind(tg)
                        elif self.holds(value):
                            self.bind(tg, True, self.class_of(value))
                elif isinstance(n, (ast.For, ast.comprehension)) and self.carries(n.iter):
                    self.bind(n.target)
            if (len(self.values), len(self.objects), self.w.size()) == before:
                break


class Walk:
    """Whole walks from the start function until the parameters and holders stop growing."""

    def __init__(self, ix: Index, start, param: str):
        self.ix, self.start = ix, start
        self.vparams, self.oparams = {start[:2]: {param}}, {}      # function -> its parameters carrying it
        self.vhold, self.ohold = set(), {}      # (class, attr) storing the value / a holder (-> its class)
        self.vnames, self.onames = set(), set()
        while True:
            before = self.size()
            self.order, self.edges, self.unresolved, self.seen, self.memo = [], {}, set(), set(), {}
            self.visit(start)
            if self.size() == before:
                break

    def size(self):
        return (sum(map(len, self.vparams.values())), sum(len(p) + sum(map(bool, p.values()))
                                                           for p in self.oparams.values()),
                len(self.vhold), len(self.ohold), sum(map(bool, self.ohold.values())))

    def reads_value(self, node, name: str, first=None) -> bool:
        """Whether node reads the value through `name.A` or `name.B...A` (B, ...: holder attributes)."""
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute) and n.attr in self.vnames:
                attrs, v = [], n.value
                while isinstance(v, ast.Attribute):
                    attrs, v = [v.attr] + attrs, v.value
                if (isinstance(v, ast.Name) and v.id == name and set(attrs) <= self.onames
                        and (first is None or (attrs or [n.attr])[0] in first)):
                    return True
        return False

    def wants(self, t, name: str, first=None, cls=None) -> bool:
        """Whether t reads the value out of its parameter `name` (a holder), itself or through the
        calls it passes `name` to."""
        key = (t[:2], name, frozenset(first or ()))
        if key not in self.memo:
            self.memo[key] = False      # a cycle: no
            f = Frame(self, t, dry=True)
            f.objects[name] = cls
            f.bind_locals()     # aliases: policy = engine.draft_length
            self.memo[key] = any(self.reads_value(t[2], n, first if n == name else None) for n in f.objects) or any(
                self.wants(c, p, cls=f.objects[a.id]) for call in f.body if isinstance(call, ast.Call)
                for i, a in list(enumerate(call.args)) + [(k.arg, k.value) for k in call.keywords]
                if isinstance(a, ast.Name) and a.id in f.objects for c in f.callees(call.func) or []
                if isinstance(c[2], FUNC) for p in self.params(c, i, a))
        return self.memo[key]

    def visit(self, t) -> None:
        self.seen.add(t[:2])
        if t[0] not in self.order:
            self.order.append(t[0])
        f = Frame(self, t)
        f.bind_locals()
        if isinstance(f.node, ast.ClassDef):
            f.stored = {a for k, a in list(self.vhold) + list(self.ohold) if k == f.ckey}
        for call in sorted((n for n in f.body if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset)):
            args = list(enumerate(call.args)) + [(k.arg, k.value) for k in call.keywords]
            vals = [(i, a) for i, a in args if f.carries(a)]
            objs = [(i, a, f.class_of(a)) for i, a in args if not f.carries(a) and f.holds(a)]
            found = f.callees(call.func) if vals or objs else []
            if found is None and vals:
                self.unresolved.add(f"{t[0]}:{t[1]}: {ast.unparse(call.func)}(...)")
            for c in found or []:
                self.enter(t, c, vals, objs)
        if f.stored and f.ckey:      # the methods that read what this function stored in self
            for sub in self.ix.family(f.ckey):
                for m in self.ix.classes[sub].body:
                    if (isinstance(m, FUNC) and m is not f.node and m.args.args
                            and self.wants((sub[0], f"{sub[1]}.{m.name}", m, sub), m.args.args[0].arg, f.stored)):
                        self.edge(t, (sub[0], f"{sub[1]}.{m.name}", m, sub))

    def enter(self, t, c, vals, objs) -> None:
        """Bind the call's carrying arguments to c's parameters (or fields) and walk c if any landed."""
        node, ckey = c[2], c[3]
        if isinstance(node, ast.ClassDef):     # a class without __init__: its annotated fields
            fields = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
            field = {i: (fields[i] if isinstance(i, int) and i < len(fields) else i) for i, *_ in vals + objs}
            self.vhold |= {(ckey, field[i]) for i, _ in vals if field[i]}
            self.vnames |= {field[i] for i, _ in vals if field[i]}
            for i, _, cls in objs:
                if field[i]:
                    self.ohold[(ckey, field[i])] = self.ohold.get((ckey, field[i])) or cls
                    self.onames.add(field[i])
            if any(field.values()):
                self.edge(t, c)
            return
        vp = {p for i, e in vals for p in self.params(c, i, e)}
        op = {p: cls for i, e, cls in objs for p in self.params(c, i, e) if self.wants(c, p, cls=cls)}
        if not vp and not op:
            return
        self.vparams.setdefault(c[:2], set()).update(vp)
        known = self.oparams.setdefault(c[:2], {})
        for p, cls in op.items():
            known[p] = known.get(p) or cls
        self.edge(t, c)

    @staticmethod
    def params(c, i, e) -> list[str]:
        """The parameters of walk target c that argument i (a position or a keyword) lands in."""
        a = c[2].args
        pos = [p.arg for p in a.posonlyargs + a.args][1 if c[3] else 0:]
        names = pos + [p.arg for p in a.kwonlyargs]
        if isinstance(i, int) and isinstance(e, ast.Starred):
            return pos[i:] + ([a.vararg.arg] if a.vararg else [])
        if isinstance(i, int):
            return [pos[i]] if i < len(pos) else [a.vararg.arg] if a.vararg else []
        if i is None:     # **kwargs
            return names + ([a.kwarg.arg] if a.kwarg else [])
        return [i] if i in names else [a.kwarg.arg] if a.kwarg else []

    def edge(self, t, c) -> None:
        key = (f"{t[0]}:{t[1]}", f"{c[0]}:{c[1]}")
        self.edges.setdefault(key, None)
        if c[:2] not in self.seen:
            self.visit(c)


def trace(root: Path, entry: str, param: str) -> dict:
    """The walk of `param` from `entry` (module.Class.function or module.function) in root's mtpx."""
    ix = Index(root)
    mod = next(m for m in sorted(ix.defs, key=len, reverse=True) if entry.startswith(m + "."))
    cls, _, fn = entry[len(mod) + 1:].rpartition(".")
    w = Walk(ix, ix.method((mod, cls), fn) if cls else ix.target(mod, ix.defs[mod][fn]), param)
    first = {m: i for i, m in enumerate(w.order)}
    calls = {}      # module -> the modules it calls
    for a, b in w.edges:
        calls.setdefault(a.split(":")[0], set()).add(b.split(":")[0])

    def reaches(src, dst):
        seen, todo = {src}, [src]
        while todo:
            for m in calls.get(todo.pop(), ()):
                if m == dst:
                    return True
                todo += [m] if m not in seen and not seen.add(m) else []
        return False

    def up(a, b):
        la, lb = ix.layer(a), ix.layer(b)
        if a == b or la is None or lb is None:
            return False
        return lb < la or (lb == la and first[b] < first[a] and reaches(b, a))
    returns = [e for e in w.edges if up(e[0].split(":")[0], e[1].split(":")[0])]
    return {"entry": entry, "param": param, "modules": w.order, "edges": [list(e) for e in w.edges],
            "returns": [list(e) for e in returns],
            "return_module_pairs": sorted({(a.split(":")[0], b.split(":")[0]) for a, b in returns}),
            "unresolved": sorted(w.unresolved), "value_attributes": sorted(w.vnames),
            "holder_attributes": sorted(w.onames)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path("."), help="the tree holding mtpx/ and pyproject.toml")
    ap.add_argument("--entry", default="mtpx.engine.llm.LLM.__init__")
    ap.add_argument("--param", default="num_speculative_tokens")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    out = trace(args.root.resolve(), args.entry, args.param)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    up = {tuple(e) for e in out["returns"]}
    print(f"{len(out['modules'])} modules, in visit order:", *out["modules"], sep="\n  ")
    print(f"{len(out['edges'])} call edges (R: a return to a module higher up):",
          *(f"{'R' if tuple(e) in up else ' '} {e[0]} -> {e[1]}" for e in out["edges"]), sep="\n  ")
    print(f"{len(out['returns'])} returns, {len(out['return_module_pairs'])} distinct module pairs:",
          *(f"{a} -> {b}" for a, b in out["return_module_pairs"]), sep="\n  ")
    print(f"{len(out['unresolved'])} calls passing the value, callee not resolved:", *out["unresolved"], sep="\n  ")
    print("attributes storing the value:", ", ".join(out["value_attributes"]))
    print("attributes storing a holder:", ", ".join(out["holder_attributes"]))


if __name__ == "__main__":
    main()

"""Follow a value statically through mtpx's calls (Python's ast; nothing is imported or run).

    python tools/trace_value.py --root /work/base        # LLM.__init__'s num_speculative_tokens
    python tools/trace_value.py --root . --entry mtpx.engine.llm.LLM.__init__ --param k --json

Carriers of the value in a function: a parameter it landed in; a name bound to a carrying expression
(`k = n`, `min(n, d)`, `n + 1`, `for k in range(n)`; not an if expression's test, a lambda, `x[k]`, or a
call into mtpx or another package); `self.A` once the class (a base or a subclass: mixins) stored it
there, or a class without `__init__` got it as field A; `X.A` where X is a *holder*: an object built by
an mtpx call given the value or a holder (`self.speculator = build_speculator(spec, model, k)`), `self`
of a class storing one, a parameter bound to one. A call passes the value on when an argument carries
it, or is a holder that the callee reads it out of (`engine.num_speculative_tokens`, also through
aliases and the calls it forwards the holder to). Callees resolve under ROOT/mtpx through imports,
`module.f`, `C(...)` -> `C.__init__`, `TABLE[key](...)` (a module-level dict of names), `super().m`,
and `X.m` for X of known class (self, an annotation, the holder's class, `self.x = C(...)`, a property's
return annotation). A class storing the value or a holder in `self.A` also passes it to each method of
the class reading it through `self.A` (edge: storer -> reader). The walk is depth first, calls in
source order, a function analysed again only for a new parameter, repeated until nothing grows.
Builtins and other packages are skipped; unresolved callees given the value itself are listed.

A *return to a module higher up* is a call edge A -> B between modules where B is in a higher layer of
pyproject.toml's import-linter layers contract, or in the same layer, visited before A, with a chain of
the walk's calls from B to A: the value left B, went down to A and comes back up to B.
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
    """ROOT/mtpx's modules: module-level definitions and dicts of names, imports, classes; the layers."""

    def __init__(self, root: Path):
        self.defs, self.tables, self.imports = {}, {}, {}
        for path in sorted((root / "mtpx").rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            mod = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            tree = ast.parse(path.read_text())
            package = mod if parts[-1] == "__init__" else mod.rpartition(".")[0]
            self.defs[mod] = {n.name: n for n in tree.body if isinstance(n, (FUNC, ast.ClassDef))}
            self.tables[mod] = {t.id: [v.id for v in n.value.values if isinstance(v, ast.Name)]
                                for n in tree.body if isinstance(n, ast.Assign)
                                and isinstance(n.value, ast.Dict)
                                for t in n.targets if isinstance(t, ast.Name)}
            imports = self.imports[mod] = {}
            for node in ast.walk(tree):
                for a in node.names if isinstance(node, ast.Import) else []:
                    top = a.name.split(".")[0]
                    imports[a.asname or top] = ("module", a.name if a.asname else top)
                if isinstance(node, ast.ImportFrom):
                    src = ".".join(p for p in (package.rsplit(".", node.level - 1)[0] if node.level else "",
                                               node.module or "") if p)
                    imports.update({a.asname or a.name: ("name", src, a.name) for a in node.names})
        self.classes = {(m, n): d for m, ds in self.defs.items() for n, d in ds.items()
                        if isinstance(d, ast.ClassDef)}
        linter = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]
        contract = next(c for c in linter["contracts"] if c["type"] == "layers")
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
        """The class key (module, name) an annotation or callee names (`C`, `"C"`, `C | None`), or None."""
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            expr = ast.parse(expr.value, mode="eval").body
        if isinstance(expr, ast.BinOp):
            return self.class_named(mod, expr.left) or self.class_named(mod, expr.right)
        r = self.resolve(mod, expr.id) if isinstance(expr, ast.Name) else None
        return (r[1], r[2].name) if r and r[0] == "def" and isinstance(r[2], ast.ClassDef) else None

    def bases(self, key):
        """key and its mtpx base classes, nearest first."""
        out = [key]
        for b in self.classes[key].bases:
            found = self.class_named(key[0], b)
            out += [k for k in (self.bases(found) if found else []) if k not in out]
        return out

    def family(self, key):
        """key, its bases and its subclasses (which share self when key is a mixin)."""
        return self.bases(key) + sorted(k for k in self.classes if k != key and key in self.bases(k))

    def method(self, key, name):
        """The walk target (module, qualname, node, class key) of method `name` of key or a base, or None."""
        return next(((k[0], f"{k[1]}.{name}", n, k) for k in (self.bases(key) if key else [])
                     for n in self.classes[k].body if isinstance(n, FUNC) and n.name == name), None)

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
        plain = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp, ast.Constant,
                 ast.JoinedStr)
        made = ("list", "dict", "set")
        self.builtin_typed = {tg.id for tg, v in assigns if isinstance(tg, ast.Name) and (
            isinstance(v, plain) or isinstance(v, ast.Call) and getattr(v.func, "id", 0) in made)}
        self.stored, self.dry, self.typing = set(), dry, set()

    def _self_attr(self, e):
        return isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == self.selfname

    def _stored(self, attr, holders) -> bool:
        return any((k, attr) in holders for k in self.ix.family(self.ckey))

    def carries(self, e) -> bool:
        if isinstance(e, ast.Name):
            return e.id in self.values
        if isinstance(e, ast.Attribute):
            return self._stored(e.attr, self.w.vhold) if self._self_attr(e) else (
                e.attr in self.w.vnames and self.holds(e.value))
        if isinstance(e, ast.IfExp):
            return self.carries(e.body) or self.carries(e.orelse)
        if isinstance(e, ast.Call):     # a builtin's result (min(k, d), range(k + 1)), ks.values()
            if isinstance(e.func, ast.Attribute) and self.carries(e.func.value):
                return not self.callees(e.func)
            return (isinstance(e.func, ast.Name) and e.func.id not in self.locals
                    and hasattr(builtins, e.func.id) and any(self.carries(x) for x in e.args + e.keywords))
        if isinstance(e, ast.Subscript):    # ks[0], not drafts[:k]
            return self.carries(e.value)
        return not isinstance(e, ast.Lambda) and any(self.carries(c) for c in ast.iter_child_nodes(e))

    def holds(self, e) -> bool:
        if isinstance(e, ast.Name):
            held = self.w.vhold | set(self.w.ohold)
            return e.id in self.objects or (e.id == self.selfname
                                            and any(self._stored(a, held) for _, a in held))
        if isinstance(e, ast.Attribute):
            return self._stored(e.attr, self.w.ohold) if self._self_attr(e) else (
                e.attr in self.w.onames and self.holds(e.value))
        if isinstance(e, ast.IfExp):
            return self.holds(e.body) or self.holds(e.orelse)
        if isinstance(e, ast.Call):
            return bool(self.callees(e.func)) and any(self.carries(x) or self.holds(x)
                                                      for x in e.args + e.keywords)
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
            found = next((c for n in self.body if isinstance(n, ast.Assign)
                          and any(getattr(x, "id", None) == e.id for x in n.targets)
                          if (c := self.class_of(n.value))), None)
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
                elif isinstance(n, ast.AnnAssign) and e.attr == getattr(tg[0], "attr",
                                                                         getattr(tg[0], "id", 0)):
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
            return [ix.target(r[1], r[2])] if r and r[0] == "def" else [] if r == ("external",) else None
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
        local = not isinstance(root, ast.Name) or root.id in self.locals
        r = None if local else ix.resolve(self.mod, root.id)
        if r and isinstance(v, ast.Name) and r[0] == "module":
            found = ix.resolve(r[1], func.attr)
            return [ix.target(found[1], found[2])] if found and found[0] == "def" else None
        found = ix.method(ix.class_named(self.mod, v), func.attr) if r and isinstance(v, ast.Name) else None
        return [found] if found else [] if r and r[0] == "external" else None

    def bind(self, tg, obj: bool = False, cls=None) -> None:
        """Bind target tg to the value, or (obj) to a holder of class cls."""
        if isinstance(tg, (ast.Tuple, ast.List, ast.Starred)):
            for x in getattr(tg, "elts", None) or [tg.value]:
                self.bind(x, obj, cls)
        elif isinstance(tg, ast.Name):
            self.objects.update({tg.id: self.objects.get(tg.id) or cls}) if obj else self.values.add(tg.id)
        elif self._self_attr(tg) and self.ckey and not self.dry:
            self.stored.add(tg.attr)
            self.w.hold(self.ckey, tg.attr, obj, cls)

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

    def hold(self, ckey, attr, obj: bool, cls=None) -> None:
        """Class ckey stores the value (or a holder of class cls) in attribute attr."""
        if obj:
            self.ohold[(ckey, attr)] = self.ohold.get((ckey, attr)) or cls
            self.onames.add(attr)
        else:
            self.vhold.add((ckey, attr))
            self.vnames.add(attr)

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
            self.memo[key] = any(self.reads_value(t[2], n, first if n == name else None)
                                 for n in f.objects) or any(
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
        calls = sorted((n for n in f.body if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
        for call in calls:
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
                    reader = (sub[0], f"{sub[1]}.{getattr(m, 'name', '')}", m, sub)
                    if (isinstance(m, FUNC) and m is not f.node and m.args.args
                            and self.wants(reader, m.args.args[0].arg, f.stored)):
                        self.edge(t, reader)

    def enter(self, t, c, vals, objs) -> None:
        """Bind the call's carrying arguments to c's parameters (or fields) and walk c if any landed."""
        node, ckey = c[2], c[3]
        if isinstance(node, ast.ClassDef):     # a class without __init__: its annotated fields
            fields = [s.target.id for s in node.body
                      if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
            field = {i: (fields[i] if isinstance(i, int) and i < len(fields) else i) for i, *_ in vals + objs}
            for i, _, *cls in vals + objs:
                if field[i]:
                    self.hold(ckey, field[i], bool(cls), *cls)
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
    print(f"{len(out['unresolved'])} calls passing the value, callee not resolved:", *out["unresolved"],
          sep="\n  ")
    print("attributes storing the value:", ", ".join(out["value_attributes"]))
    print("attributes storing a holder:", ", ".join(out["holder_attributes"]))


if __name__ == "__main__":
    main()

"""The draft-length policy's interface (issue 67): outside mtpx/auto_k the policy object is used
through at most three members, plan, observe and max_k (the scheduler's), everything else through
the package's functions; FixedDraftLength stays a few lines."""
import ast
from pathlib import Path

import mtpx

ROOT = Path(mtpx.__file__).parent
POLICY_NAMES = {"draft_length", "policy"}     # what the code outside the package calls the policy


def _is_policy(node) -> bool:
    return (isinstance(node, ast.Name) and node.id in POLICY_NAMES
            or isinstance(node, ast.Attribute) and node.attr in POLICY_NAMES)


def policy_members_used_outside_the_package(root: Path = ROOT) -> dict[str, set[str]]:
    """{member: files} for every attribute read, written or named in getattr/setattr/hasattr on an
    expression naming the policy (POLICY_NAMES) in mtpx/ outside mtpx/auto_k."""
    used: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        if (root / "auto_k") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and _is_policy(node.value):
                used.setdefault(node.attr, set()).add(path.name)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2
                  and _is_policy(node.args[0]) and isinstance(node.args[1], ast.Constant)):
                used.setdefault(node.args[1].value, set()).add(path.name)
    return used


def test_the_policy_is_used_through_plan_observe_and_max_k_outside_its_package():
    used = policy_members_used_outside_the_package()
    assert set(used) == {"plan", "observe", "max_k"}, used
    assert used["plan"] == used["observe"] == used["max_k"] == {"scheduler.py"}


def test_the_walk_sees_a_member_used_outside_the_package(tmp_path):
    """The walk would fail the test above: a module reading another member is listed."""
    (tmp_path / "auto_k").mkdir()
    (tmp_path / "auto_k" / "inside.py").write_text("policy.reset()\n")
    (tmp_path / "engine.py").write_text("self.draft_length.reset()\nhasattr(policy, 'forced')\n")
    used = policy_members_used_outside_the_package(tmp_path)
    assert used == {"reset": {"engine.py"}, "forced": {"engine.py"}}


def test_the_fixed_draft_length_is_a_few_lines():
    assert len((ROOT / "auto_k" / "fixed.py").read_text().splitlines()) <= 25

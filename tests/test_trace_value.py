"""tools/trace_value.py on a synthetic five-module package: the modules it visits, the calls it
follows and the returns to a module higher up it counts (issue 67's count of how
num_speculative_tokens travels)."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "trace_value.py"

PACKAGE = {
    "pyproject.toml": """
        [tool.importlinter]
        root_package = "mtpx"
        [[tool.importlinter.contracts]]
        name = "layers"
        type = "layers"
        layers = ["mtpx.top", "mtpx.mid", "mtpx.low"]
        """,
    "mtpx/top/api.py": """
        from mtpx.low.logs import log
        from mtpx.mid.engine import Engine


        class Api:
            def __init__(self, num_speculative_tokens, client):
                k = num_speculative_tokens
                log("start")                 # does not pass the value: not followed
                self.engine = Engine(k + 1)
                client.send(k)               # a parameter of unknown class: listed
        """,
    "mtpx/mid/engine.py": """
        from mtpx.low.runner import Runner
        from mtpx.mid.warm import warm


        class Engine:
            def __init__(self, k):
                self.k = k
                self.runner = Runner(min(k, 4))
                warm(self)                   # passes the holder: warm reads engine.k

            def add(self, depth):
                return depth

            def step(self):                  # reads self.k: the value reaches it through self
                return self.runner.run(self.k)

            def size(self):                  # never sees the value
                return 1


        def note(depth):
            return depth
        """,
    "mtpx/mid/warm.py": """
        def warm(engine):
            engine.add(engine.k)             # back up to engine.py, which called warm
        """,
    "mtpx/low/runner.py": """
        from mtpx.mid.engine import note


        class Runner:
            def __init__(self, depth):
                self.depth = depth
                note(depth)                  # up to a higher layer

            def run(self, k):
                return k
        """,
    "mtpx/low/logs.py": """
        def log(message):
            return message
        """,
}


def test_trace_value_counts_modules_edges_and_returns(tmp_path):
    for name, text in PACKAGE.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    done = subprocess.run([sys.executable, str(TOOL), "--root", str(tmp_path),
                           "--entry", "mtpx.top.api.Api.__init__", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["modules"] == ["mtpx.top.api", "mtpx.mid.engine", "mtpx.low.runner", "mtpx.mid.warm"]
    assert out["edges"] == [
        ["mtpx.top.api:Api.__init__", "mtpx.mid.engine:Engine.__init__"],
        ["mtpx.mid.engine:Engine.__init__", "mtpx.low.runner:Runner.__init__"],
        ["mtpx.low.runner:Runner.__init__", "mtpx.mid.engine:note"],
        ["mtpx.mid.engine:Engine.__init__", "mtpx.mid.warm:warm"],
        ["mtpx.mid.warm:warm", "mtpx.mid.engine:Engine.add"],
        ["mtpx.mid.engine:Engine.__init__", "mtpx.mid.engine:Engine.step"],
        ["mtpx.mid.engine:Engine.step", "mtpx.low.runner:Runner.run"],
    ]
    # low -> mid is a higher layer; warm -> engine re-enters engine.py, which the value left for warm.py
    assert out["returns"] == [["mtpx.low.runner:Runner.__init__", "mtpx.mid.engine:note"],
                              ["mtpx.mid.warm:warm", "mtpx.mid.engine:Engine.add"]]
    assert out["return_module_pairs"] == [["mtpx.low.runner", "mtpx.mid.engine"],
                                          ["mtpx.mid.warm", "mtpx.mid.engine"]]
    assert out["unresolved"] == ["mtpx.top.api:Api.__init__: client.send(...)"]
    assert out["value_attributes"] == ["depth", "k"] and out["holder_attributes"] == ["engine", "runner"]

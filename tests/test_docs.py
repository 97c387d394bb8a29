"""The documentation: docs/configuration.md is what tools/gen_config_docs.py generates from the
structured configs; every page is in mkdocs.yml's nav and every nav entry is a page; README.md
stays a landing page (at most 250 lines) whose links resolve; nothing in mtpx/, tests/, conf/,
docs/ or README.md points at a file outside the repository; `mkdocs build --strict` passes."""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_config_docs", ROOT / "tools" / "gen_config_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_page_is_generated_from_the_configs():
    gen = _generator()
    text = gen.render()
    assert (DOCS / "configuration.md").read_text() == text, "run python tools/gen_config_docs.py"
    # one row per key of every group, with the meaning from its single source
    assert "| `engine.max_num_seqs` | int | `64` | Running requests at most (batch slots). |" in text
    assert ("| `eval.max_tokens` | int | `128` | Output tokens per request at most (data=random: "
            "exactly" in text)
    # the YAML's override
    assert "| `bench.concurrency` | int \\| None | `16` | Requests in flight at most" in text
    assert "| `spec.num_speculative_tokens` | any | `8` | Drafts per step (an integer >= 1), or auto" in text
    assert '| `spec.verify` | "standard" \\| "block" | `block` |' in text                   # +spec=mtp8_block
    for group in ("model", "data", "spec", "engine", "eval", "bench", "serve", "train", "distill", "logger"):
        assert f"## `{group}`" in text


def test_generator_reads_docstrings_before_yaml_comments(tmp_path, monkeypatch):
    gen = _generator()
    src = tmp_path / "conf_mod.py"
    src.write_text("from dataclasses import dataclass\n\n\n@dataclass\nclass C:\n"
                   "    a: int = 1\n    \"\"\"the docstring of a\"\"\"\n"
                   "    b: int = 2  # the comment of b\n    c: int = 3\n")
    spec = importlib.util.spec_from_file_location("conf_mod", src)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "conf_mod", module)     # inspect.getsource finds it there
    spec.loader.exec_module(module)
    rows = gen.table((module.C,), module.C, {"c": 30}, {"a": "yaml a", "b": "yaml b", "c": "yaml c"}, "g.")
    assert rows[2:] == ["| `g.a` | int | `1` | the docstring of a |",
                        "| `g.b` | int | `2` | yaml b |",
                        "| `g.c` | int | `30` | yaml c |"]


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [p for v in node.values() for p in _nav_pages(v)]
    return [p for v in node for p in _nav_pages(v)]


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages
    assert len(nav) == len(set(nav))
    # and the index links every other page
    index = (DOCS / "index.md").read_text()
    assert sorted(set(re.findall(r"\]\(([\w/]+\.md)", index))) == sorted(set(pages) - {"index.md"})


def test_site_builds_with_warnings_as_errors(tmp_path):
    """`mkdocs build --strict`, as .ci/run runs it: a broken link or anchor, or a page missing
    from the nav, fails it."""
    pytest.importorskip("material", reason="mkdocs-material is in the dev extra")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()


def test_readme_is_a_landing_page_whose_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert "docs/getting_started.md" in local and "docs/configuration.md" in local
    for link in local:
        assert (ROOT / link).exists(), link
    # the commands a newcomer runs, as .ci/run runs them
    assert "python -m pip install torch==2.13.0" in text and 'python -m pip install -e ".[dev]"' in text
    assert "python train_or_eval.py +spec=mtp8" in text and "python -m pytest -q" in text


def test_nothing_points_outside_the_repository():
    # the two patterns are joined from parts so that this file does not match itself
    patterns = ["ARCHITECTURE" + ".md", "shared" + "/"]
    out = subprocess.run(["git", "grep", "--untracked", "-n", "-e", patterns[0], "-e", patterns[1], "--",
                          "mtpx", "tests", "conf", "docs", "README.md"],
                         cwd=ROOT, capture_output=True, text=True).stdout.splitlines()
    # the one exception: the data directory's default, where this project's runs find the public
    # data sets (MTPX_DATA_DIR or data_dir=DIR sets it anywhere else)
    assert [line for line in out
            if not (line.startswith("conf/config.yaml:")
                    and "data_dir: ${oc.env:MTPX_DATA_DIR," in line)] == []


# --- README and the docs agree where they repeat: commands, tools, config keys, figures ---------

_PROGRAMS = ("python train_or_eval.py", "python -m pytest", "python -m pip", "python tools/")


def _commands(text: str) -> list[str]:
    """The commands in a page's fenced code blocks that start with one of _PROGRAMS, one string
    each: continuation lines joined, trailing comments dropped, whitespace collapsed."""
    out = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        pending = ""
        for line in block.splitlines():
            line = "" if line.lstrip().startswith("#") else re.sub(r"\s+#.*$", "", line)
            pending = f"{pending} {line.strip()}".strip()
            if pending.endswith("\\"):
                pending = pending[:-1]
                continue
            if pending.startswith(_PROGRAMS):
                out.append(" ".join(pending.removesuffix("&").split()))     # `... &`: in the background
            pending = ""
    return out


def _pages() -> dict[str, str]:
    pages = {"README.md": (ROOT / "README.md").read_text()}
    pages.update({f"docs/{p.name}": p.read_text() for p in sorted(DOCS.glob("*.md"))})
    return pages


def test_every_readme_command_is_a_docs_command_with_the_same_arguments():
    pages = _pages()
    readme = _commands(pages.pop("README.md"))
    assert len(readme) >= 10 and "python train_or_eval.py +spec=mtp8" in readme
    docs = {command for text in pages.values() for command in _commands(text)}
    assert [command for command in readme if command not in docs] == []


def test_commands_name_tools_markers_and_config_keys_that_exist():
    from mtpx.cli import check_overrides

    conf = ROOT / "conf"
    # the check that train_or_eval.py runs before Hydra's main refuses a misspelt key
    assert check_overrides(["+spec=mtp8", "eval.num_promts=8"], conf) is not None
    registered = (ROOT / "pyproject.toml").read_text().split("markers = [")[1].split("]")[0]
    markers = {line.strip().strip('"').split(":")[0] for line in registered.splitlines() if line.strip()}
    checked = 0
    for page, text in _pages().items():
        for tool in re.findall(r"\btools/[\w/]+\.py\b", text):
            assert (ROOT / tool).is_file(), f"{page} names {tool}"
        for command in _commands(text):
            argv = shlex.split(command)
            if command.startswith("python train_or_eval.py"):
                assert check_overrides(argv[2:], conf) is None, f"{page}: {command}"
                checked += 1
            elif command.startswith("python -m pytest") and "-m" in argv[2:]:
                assert argv[argv.index("-m", 2) + 1] in markers | {"not slow"}, f"{page}: {command}"
    assert checked >= 30


def _section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def _seconds_after(text: str, word: str) -> str:
    """The first figure in seconds ("70 s", "37-47 s") after the first `word` in text."""
    return re.search(r"(\d[\d.]*(?:-\d[\d.]*)?) s\b", text.split(word, 1)[1]).group(1)


def test_start_and_test_times_agree_where_pages_repeat_them():
    pages = _pages()
    # the default suite's time on 2 cores: one figure on every page that gives one
    test_times = {page: re.findall(r"(\d[\d.]*(?:-\d[\d.]*)?) minutes on 2 (?:CPU )?cores", text)
                  for page, text in pages.items()}
    assert test_times["README.md"] and test_times["docs/getting_started.md"]
    assert len({figure for figures in test_times.values() for figure in figures}) == 1, test_times
    # the main job's cold and warm start: getting started repeats README's figures, no others
    readme = _section(pages["README.md"], "## The two commands")
    started = _section(pages["docs/getting_started.md"], "## The two commands")
    for word in ("cold", "warm"):
        assert _seconds_after(started, word) == _seconds_after(readme, word), word
    seconds = r"(\d[\d.]*(?:-\d[\d.]*)?) s\b"
    assert set(re.findall(seconds, started)) <= set(re.findall(seconds, readme))
    # and README's measured start times are those of the compiled step's table
    table = _section(pages["docs/compiled_step.md"], "Building an engine on the demo")
    for figure in re.findall(r"(\d+\.\d) s\b", readme):
        assert figure in table, figure


def test_repeated_tables_agree_with_their_source():
    pages = _pages()
    # README's results table is docs/results.md's, row for row
    rows = [line for line in _section(pages["README.md"], "## Results").splitlines() if line.startswith("| ")]
    assert len(rows) >= 5
    assert [row for row in rows if row not in pages["docs/results.md"]] == []
    # the engine page's option table gives the defaults of the generated configuration page
    configuration, engine = pages["docs/configuration.md"], pages["docs/engine.md"]
    configured = dict(re.findall(r"^\| `(engine\.\w+)` \| .*? \| `([^`]*)` \|", configuration, re.M))
    options = re.findall(r"^\| `(engine\.\w+)` \| `?([^|`]*?)`? \|", engine, re.M)
    assert len(options) >= 10
    assert [(key, default, configured.get(key)) for key, default in options
            if configured.get(key) != default] == []


def test_experiments_is_an_index_of_studies_within_its_limits():
    # issue 67: every folder under experiments/ has a README.md that experiments/README.md links, no
    # raw log is tracked there, and the tracked files stay within 400 and 5 MB
    listed = subprocess.run(["git", "ls-files", "-z", "experiments"], cwd=ROOT, capture_output=True,
                            text=True)
    tracked = [path for path in listed.stdout.split("\0") if path]
    assert listed.returncode == 0 and len(tracked) >= 50
    folders = {str(parent.relative_to("experiments")) for path in tracked
               for parent in Path(path).parents if parent.parts[:1] == ("experiments",) and parent.parts[1:]}
    assert [folder for folder in sorted(folders) if f"experiments/{folder}/README.md" not in tracked] == []
    linked = set(re.findall(r"\]\(([\w./-]+)/README\.md\)", (ROOT / "experiments" / "README.md").read_text()))
    assert sorted(folders - linked) == [] and sorted(linked - folders) == []
    assert [path for path in tracked if path.endswith((".log", ".jsonl", ".out", ".err"))] == []
    assert len(tracked) <= 400
    assert sum((ROOT / path).stat().st_size for path in tracked) <= 5_000_000


def test_every_experiments_path_the_docs_name_exists():
    pages = _pages()
    named = {path.rstrip(".,/") for text in pages.values()
             for path in re.findall(r"\bexperiments/[\w./*-]*", text)}
    # results.md's table of automatic k's rules names its folders under the column `experiments/`
    rules = _section(pages["docs/results.md"], "### The runs behind its rules")
    rows = re.findall(r"^\| (?!rule \||---).*\|$", rules, re.M)
    named |= {f"experiments/{path}" for row in rows
              for path in re.findall(r"`([\w/]+)`", row.rsplit("|", 2)[1])}
    assert len(named) >= 60
    assert sorted(path for path in named if not any(ROOT.glob(path))) == []

#!/usr/bin/env python3
"""Tests of scripts/module-cycles.py on small fixture crates written to a temporary directory.

Run: python3 scripts/test_module_cycles.py (scripts/test.sh runs it before the check itself).
"""

import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "module-cycles.py"


def crate(files: dict) -> Path:
    root = Path(tempfile.mkdtemp(prefix="module-cycles-"))
    (root / "Cargo.toml").write_text('[package]\nname = "fixture"\n')
    for name, text in files.items():
        path = root / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, check=False)


class ModuleCycles(unittest.TestCase):
    def test_a_circle_between_two_files_fails_and_names_both_edges(self):
        result = run(crate({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "use crate::b::B;\npub struct A;\n",
            "b.rs": "pub struct B;\nfn f() { let _ = super::a::A; }\n",
        }))
        self.assertEqual(result.returncode, 1, result.stdout)
        self.assertIn("crate::a -> crate::b", result.stdout)
        self.assertIn("crate::b -> crate::a", result.stdout)

    def test_a_circle_between_folders_fails(self):
        # No two files import each other, but the folders do: proxy -> upstreams -> proxy.
        result = run(crate({
            "lib.rs": "mod proxy;\nmod upstreams;\n",
            "proxy/mod.rs": "pub(crate) mod route;\n",
            "proxy/route.rs": "use crate::upstreams::{state::State, target};\n",
            "upstreams/mod.rs": "pub(crate) mod state;\npub(crate) mod target;\npub(crate) mod slots;\n",
            "upstreams/state.rs": "pub(crate) struct State;\n",
            "upstreams/target.rs": "pub(crate) struct Target;\n",
            "upstreams/slots.rs": "use crate::proxy::route as r;\n",
        }))
        self.assertEqual(result.returncode, 1, result.stdout)
        self.assertIn("crate::proxy -> crate::upstreams", result.stdout)
        self.assertIn("crate::upstreams -> crate::proxy", result.stdout)

    def test_a_layered_crate_passes(self):
        # Parents and children may use each other (re-exports, `use super::*`), test modules may
        # reach anywhere, and comments and strings are not code.
        result = run(crate({
            "lib.rs": "mod base;\nmod top;\npub use top::Top;\n",
            "base.rs": (
                "//! See [`top`](crate::top::Top).\n"
                "const S: &str = \"crate::top::Top\";\n"
                "const R: &str = r#\"use crate::top;\"#;\n"
                "const C: char = '\"';\n"
                "pub(crate) struct Base;\n"
                "#[cfg(test)]\nmod tests {\n    use crate::top::Top;\n}\n"
            ),
            "top.rs": "use crate::base::Base;\npub struct Top(Base);\nfn f() { let _ = crate::base::Base; }\n",
        }))
        self.assertEqual(result.returncode, 0, result.stdout)

    def test_inline_modules_resolve_super_from_themselves(self):
        # `super` inside `mod inner` is `a`, so `super::super::b` is `b`: a real circle.
        result = run(crate({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "mod inner {\n    use super::super::b::B;\n}\npub struct A;\n",
            "b.rs": "use crate::a::A;\npub struct B;\n",
        }))
        self.assertEqual(result.returncode, 1, result.stdout)


if __name__ == "__main__":
    unittest.main()

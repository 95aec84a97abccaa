//! The crate's modules form a straight stack: no module uses one that uses it back, directly or
//! through others (issue #10). Read from the sources, so a new `use` that closes a circle fails
//! here rather than in review.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable src") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `kinds/llama.rs` → `kinds::llama`, `kinds/mod.rs` → `kinds`.
fn module_name(src: &Path, file: &Path) -> String {
    let relative = file
        .strip_prefix(src)
        .expect("under src")
        .with_extension("");
    let parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .filter(|p| p != "mod")
        .collect();
    parts.join("::")
}

/// The modules a source text names: `crate::a`, `crate::a::b` and `crate::a::{b, c}` (when
/// `a::b` is a module), and `child::` paths to the module's own submodules.
fn references(own: &str, text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut note = |first: &str, second: Option<&str>| {
        let nested = second.map(|s| format!("{first}::{s}"));
        match nested {
            Some(nested) if modules.contains(&nested) => out.insert(nested),
            _ if modules.contains(first) => out.insert(first.to_owned()),
            _ => false,
        };
    };
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        let first: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let after = rest[first.len()..].trim_start();
        let Some(after) = after.strip_prefix("::") else {
            note(&first, None);
            continue;
        };
        let after = after.trim_start();
        if let Some(list) = after.strip_prefix('{') {
            let list = &list[..list.find('}').unwrap_or(list.len())];
            for item in list.split(',') {
                let item = item.trim().split("::").next().unwrap_or("");
                note(&first, Some(item));
            }
        } else {
            let second: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            note(&first, Some(&second));
        }
    }
    // A parent reaches its children by relative paths (`llama::route`).
    for module in modules {
        if let Some(child) = module.strip_prefix(&format!("{own}::"))
            && text.contains(&format!("{child}::"))
        {
            out.insert(module.clone());
        }
    }
    out.remove(own);
    out
}

/// Depth-first search for a back edge; panics with the circle it closes.
fn visit(
    node: &str,
    uses: &BTreeMap<String, BTreeSet<String>>,
    stack: &mut Vec<String>,
    done: &mut BTreeSet<String>,
) {
    if done.contains(node) {
        return;
    }
    if let Some(at) = stack.iter().position(|n| n == node) {
        panic!("import circle: {} -> {node}", stack[at..].join(" -> "));
    }
    stack.push(node.to_owned());
    for next in uses.get(node).into_iter().flatten() {
        visit(next, uses, stack, done);
    }
    stack.pop();
    done.insert(node.to_owned());
}
#[test]
fn modules_form_a_straight_stack() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_name(&src, f)).collect();
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let name = module_name(&src, file);
        // The crate root and the binary only re-export or wire things up.
        if name == "lib" || name == "main" {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("readable source");
        let mut code = String::new();
        for line in text.lines() {
            // Unit tests may reach anywhere; they come last in every file.
            if line.trim_start().starts_with("#[cfg(test)]") {
                break;
            }
            if !line.trim_start().starts_with("//") {
                code.push_str(line);
                code.push('\n');
            }
        }
        let out = references(&name, &code, &modules);
        uses.insert(name, out);
    }
    assert!(uses["app"].contains("kinds::llama"), "{uses:?}");

    let mut done = BTreeSet::new();
    for node in uses.keys() {
        visit(node, &uses, &mut Vec::new(), &mut done);
    }
}

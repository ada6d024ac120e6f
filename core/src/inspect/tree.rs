//! A tree printed with box-drawing branches, as checkpointctl prints its views.

use std::fmt::Write;

/// One line and the lines below it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Node {
    pub label: String,
    pub children: Vec<Node>,
}

impl Node {
    pub fn new(label: impl Into<String>) -> Node {
        Node {
            label: label.into(),
            children: Vec::new(),
        }
    }

    /// Add a child and return self (for building literals).
    pub fn with(mut self, child: Node) -> Node {
        self.children.push(child);
        self
    }

    pub fn push(&mut self, child: Node) -> &mut Node {
        self.children.push(child);
        self.children.last_mut().expect("just pushed")
    }

    pub fn leaf(&mut self, label: impl Into<String>) {
        self.children.push(Node::new(label));
    }

    /// The tree as text, one node per line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.label);
        render_children(&self.children, "", &mut out);
        out
    }
}

fn render_children(children: &[Node], prefix: &str, out: &mut String) {
    for (i, child) in children.iter().enumerate() {
        let last = i + 1 == children.len();
        let (branch, indent) = if last {
            ("└── ", "    ")
        } else {
            ("├── ", "│   ")
        };
        let mut lines = child.label.lines();
        let _ = writeln!(out, "{prefix}{branch}{}", lines.next().unwrap_or(""));
        let continuation = format!("{prefix}{indent}");
        for line in lines {
            let _ = writeln!(out, "{continuation}{line}");
        }
        render_children(&child.children, &continuation, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_branches() {
        let tree = Node::new("root")
            .with(Node::new("a").with(Node::new("a1")).with(Node::new("a2")))
            .with(Node::new("b").with(Node::new("b1")));
        assert_eq!(
            tree.render(),
            "root\n├── a\n│   ├── a1\n│   └── a2\n└── b\n    └── b1\n"
        );
    }
}

//! Result tables: printed as each scenario finishes, saved as JSON, and written into
//! docs/benchmarks.md between `<!-- table:ID -->` markers so one full run regenerates
//! every number in the docs while the prose around them stays hand-written.

use std::fs;
use std::path::Path;

use serde::Serialize;

/// One scenario's table (or one part of it).
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    /// Marker name in docs/benchmarks.md.
    pub id: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(id: &str, columns: &[&str]) -> Self {
        Self {
            id: id.into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.columns.len(), "table {}", self.id);
        self.rows.push(cells);
    }

    pub fn markdown(&self) -> String {
        let mut out = format!("| {} |\n", self.columns.join(" | "));
        out += &format!("|{}\n", "---|".repeat(self.columns.len()));
        for row in &self.rows {
            out += &format!("| {} |\n", row.join(" | "));
        }
        out
    }
}

/// Everything one run measured, with where and how.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub command: String,
    pub kernel: String,
    pub machine: String,
    pub tables: Vec<Table>,
}

impl Report {
    pub fn save_json(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::write(path, serde_json::to_vec_pretty(self)?)
    }

    /// Replaces each table's block in `doc` (and the `run` block) with this run's; a
    /// table with no block yet is appended under its own heading so nothing is dropped.
    pub fn update_doc(&self, doc: &str) -> String {
        let run = format!(
            "Kernel {}; {}. Command: `{}`.\n",
            self.kernel, self.machine, self.command
        );
        let mut out = replace_block(doc, "run", &run);
        for table in &self.tables {
            out = replace_block(&out, &format!("table:{}", table.id), &table.markdown());
        }
        out
    }
}

fn replace_block(doc: &str, name: &str, body: &str) -> String {
    let open = format!("<!-- {name} -->");
    let close = format!("<!-- /{name} -->");
    match (doc.find(&open), doc.find(&close)) {
        (Some(start), Some(end)) if start < end => {
            format!("{}{open}\n{body}{}", &doc[..start], &doc[end..])
        }
        _ => format!("{doc}\n## {name}\n\n{open}\n{body}{close}\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let mut t = Table::new("s1", &["case", "p50"]);
        t.row(vec!["classic".into(), "1 ms".into()]);
        Report {
            command: "benches/run-all".into(),
            kernel: "6.18".into(),
            machine: "2 vCPU".into(),
            tables: vec![t],
        }
    }

    #[test]
    fn blocks_are_replaced_and_prose_kept() {
        let doc = "intro\n<!-- run -->\nold\n<!-- /run -->\nprose\n<!-- table:s1 -->\nold table\n<!-- /table:s1 -->\nafter\n";
        let out = report().update_doc(doc);
        assert!(out.contains("intro\n<!-- run -->\nKernel 6.18; 2 vCPU."));
        assert!(out.contains("prose\n<!-- table:s1 -->\n| case | p50 |\n|---|---|\n| classic | 1 ms |\n<!-- /table:s1 -->\nafter\n"));
        assert!(!out.contains("old"));
    }

    #[test]
    fn missing_blocks_are_appended() {
        let out = report().update_doc("intro\n");
        assert!(out.contains("<!-- table:s1 -->\n| case | p50 |"));
        assert!(out.ends_with("<!-- /table:s1 -->\n"));
    }
}

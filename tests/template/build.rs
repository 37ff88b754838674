//! `sam build`: every function the template builds with the Makefile has a target there, so
//! that the build does not stop at the first function it forgot.

use std::path::Path;

use anyhow::{Context as _, ensure};

use super::*;

/// The functions the Makefile builds (`FUNCTIONS := …`).
fn makefile_functions() -> anyhow::Result<Vec<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Makefile");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path:?}"))?;
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix("FUNCTIONS :="))
        .context("the Makefile has no FUNCTIONS list")?;
    Ok(line.split_whitespace().map(str::to_owned).collect())
}

#[test]
fn every_function_sam_builds_has_a_makefile_target() -> anyhow::Result<()> {
    let template = template()?;
    let targets = makefile_functions()?;
    for (id, function) in resources(&template, "AWS::Serverless::Function")? {
        let method = at(function, &["Metadata", "BuildMethod"])?;
        ensure!(
            method.as_str() == Some("makefile"),
            "{id} is not built by the Makefile (infra/build-lambda)"
        );
        ensure!(
            targets.iter().any(|target| target == id),
            "`sam build` would find no target build-{id} in the Makefile"
        );
    }
    Ok(())
}

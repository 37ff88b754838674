//! The masking held to Ray's own: every case of `tests/fixtures/ray-redaction-2.60/cases.json`,
//! whose expected answers Ray 2.60's `runtime_env_redaction` functions wrote (`make.py` there).

use std::path::Path;

use serde_json::Value as Json;

use super::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The cases Ray's functions answered.
fn cases() -> Result<Json, Box<dyn std::error::Error>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/ray-redaction-2.60/cases.json");
    Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
}

/// One case: its name, the input, and Ray's answer.
type Case = (String, Json, Json);

/// The cases of one function.
fn of(cases: &Json, function: &str) -> Result<Vec<Case>, Box<dyn std::error::Error>> {
    let list = cases[function]
        .as_array()
        .ok_or_else(|| format!("no {function} cases"))?;
    Ok(list
        .iter()
        .map(|case| {
            (
                case["name"].as_str().unwrap_or_default().to_owned(),
                case["input"].clone(),
                case["redacted"].clone(),
            )
        })
        .collect())
}

#[test]
fn the_placeholder_is_rays() -> TestResult {
    assert_eq!(cases()?["placeholder"], Json::from(REDACTED_PLACEHOLDER));
    Ok(())
}

#[test]
fn serialized_runtime_envs_are_masked_byte_for_byte_as_ray_masks_them() -> TestResult {
    let cases = of(&cases()?, "serialized")?;
    assert!(cases.len() >= 50, "only {} cases", cases.len());
    let mut wrong = Vec::new();
    for (name, input, expected) in cases {
        let text = input.as_str().ok_or_else(|| format!("{name}: input"))?;
        let ours = redact_serialized_runtime_env(text);
        if expected != ours.as_str() {
            wrong.push(format!(
                "{name}: {text:?}\n  ours  {ours:?}\n  Ray's {expected}"
            ));
        }
        // As an answer holds it: a JSON string, masked the same.
        let value = redact_serialized_value(input.clone());
        if value != expected {
            wrong.push(format!(
                "{name} (as a value): ours {value}, Ray's {expected}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    Ok(())
}

#[test]
fn parsed_runtime_envs_are_masked_as_ray_masks_them() -> TestResult {
    let cases = of(&cases()?, "parsed")?;
    assert!(cases.len() >= 10, "only {} cases", cases.len());
    for (name, input, expected) in cases {
        assert_eq!(redact_runtime_env(input), expected, "{name}");
    }
    Ok(())
}

#[test]
fn a_missing_serialized_runtime_env_stays_null() {
    // Ray returns what is not a string as it is: an attempt whose definition never arrived.
    assert_eq!(redact_serialized_value(Json::Null), Json::Null);
}

#[test]
fn nesting_past_the_limit_is_masked_whole() {
    // 1 object and 999 lists: read, and written back as it was (no separators inside).
    let deepest = format!("{{\"a\": {}{}}}", "[".repeat(999), "]".repeat(999));
    assert_eq!(redact_serialized_runtime_env(&deepest), deepest);
    // One more level, past anything Python's decoder reads, is not shown at all.
    let deeper = format!("{{\"a\": {}{}}}", "[".repeat(1000), "]".repeat(1000));
    assert_eq!(redact_serialized_runtime_env(&deeper), REDACTED_PLACEHOLDER);
    let far = format!("{{\"a\": {}", "[".repeat(100_000));
    assert_eq!(redact_serialized_runtime_env(&far), REDACTED_PLACEHOLDER);
}

#[test]
fn cut_text_never_panics_and_never_shows_a_value() -> TestResult {
    // Every prefix of every case: a runtime env cut short anywhere is read without a panic, and
    // whatever is answered for it holds none of the case's secrets unmasked.
    for (name, input, _) in of(&cases()?, "serialized")? {
        let text = input.as_str().ok_or_else(|| format!("{name}: input"))?;
        for (at, _) in text.char_indices() {
            let cut = &text[..at];
            let answer = redact_serialized_runtime_env(cut);
            assert!(
                answer.is_empty() == cut.is_empty(),
                "{name}: {cut:?} answered {answer:?}"
            );
            assert!(
                !answer.contains("hunter2") && !answer.contains("EXAMPLEKEY"),
                "{name}: {cut:?} answered {answer:?}"
            );
        }
    }
    Ok(())
}

//! Failure injection: `GPUCR_FAKE_CUDA_FAIL=<function>[:<CUresult>][@<nth>]`, a comma
//! list. The named function (its base name: `cuMemAlloc`, not `cuMemAlloc_v2`) returns
//! the code (a name like `CUDA_ERROR_OUT_OF_MEMORY` or `OUT_OF_MEMORY`, or a number;
//! default `CUDA_ERROR_UNKNOWN`) without doing anything: on its nth call in this process
//! (counted from 1), or on every call without `@`.

use std::collections::HashMap;
use std::sync::Mutex;

use gpucr_cuda_driver::result;
use gpucr_cuda_driver::sys::CUresult;

/// One rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailRule {
    /// The function's base name.
    pub function: String,
    /// The code it returns.
    pub code: CUresult,
    /// The call that fails (`None`: every call).
    pub nth: Option<u64>,
}

/// Parses a rule list.
pub fn parse(spec: &str) -> Result<Vec<FailRule>, String> {
    spec.split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(|rule| {
            let (rest, nth) = match rule.split_once('@') {
                Some((rest, n)) => {
                    let n = n
                        .parse::<u64>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| format!("{rule:?}: @ takes a call number from 1"))?;
                    (rest, Some(n))
                }
                None => (rule, None),
            };
            let (function, code) = match rest.split_once(':') {
                Some((f, c)) => (
                    f,
                    result::parse(c).ok_or_else(|| format!("{rule:?}: unknown CUresult {c:?}"))?,
                ),
                None => (rest, result::UNKNOWN),
            };
            if !function.starts_with("cu") {
                return Err(format!("{rule:?}: {function:?} is not a CUDA function"));
            }
            Ok(FailRule {
                function: function.to_owned(),
                code,
                nth,
            })
        })
        .collect()
}

/// Counts calls per function and answers whether this one fails.
#[derive(Debug, Default)]
pub struct Injector {
    calls: Mutex<HashMap<String, u64>>,
}

impl Injector {
    /// Counts a call of `function`; the code it must fail with, if a rule says so.
    pub fn check(&self, rules: &[FailRule], function: &str) -> Option<CUresult> {
        if !rules.iter().any(|r| r.function == function) {
            return None;
        }
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let n = calls.entry(function.to_owned()).or_insert(0);
        *n += 1;
        let n = *n;
        rules
            .iter()
            .find(|r| r.function == function && r.nth.is_none_or(|k| k == n))
            .map(|r| r.code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rules() {
        let rules =
            parse("cuMemAlloc:CUDA_ERROR_OUT_OF_MEMORY@2, cuCheckpointProcessLock:909,cuInit")
                .unwrap();
        assert_eq!(
            rules,
            vec![
                FailRule {
                    function: "cuMemAlloc".into(),
                    code: result::OUT_OF_MEMORY,
                    nth: Some(2)
                },
                FailRule {
                    function: "cuCheckpointProcessLock".into(),
                    code: result::TIMEOUT,
                    nth: None
                },
                FailRule {
                    function: "cuInit".into(),
                    code: result::UNKNOWN,
                    nth: None
                },
            ]
        );
        assert!(parse("cuMemAlloc:NOPE").is_err());
        assert!(parse("cuMemAlloc@0").is_err());
        assert!(parse("malloc").is_err());
    }

    #[test]
    fn nth_call_fails_once() {
        let rules = parse("cuMemAlloc:2@2").unwrap();
        let inj = Injector::default();
        assert_eq!(inj.check(&rules, "cuMemAlloc"), None);
        assert_eq!(inj.check(&rules, "cuMemAlloc"), Some(2));
        assert_eq!(inj.check(&rules, "cuMemAlloc"), None);
        assert_eq!(inj.check(&rules, "cuMemFree"), None);
        let always = parse("cuMemFree").unwrap();
        assert_eq!(inj.check(&always, "cuMemFree"), Some(result::UNKNOWN));
        assert_eq!(inj.check(&always, "cuMemFree"), Some(result::UNKNOWN));
    }
}

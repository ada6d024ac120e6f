//! Text formats of the KFD sysfs files.

use std::path::Path;

use super::KfdError;
use crate::model::Properties;

/// Parses a `properties` file: one `NAME VALUE` pair per line, VALUE an unsigned decimal
/// (the kernel prints them with `%s %u` / `%s %llu`). Blank lines are ignored; anything
/// else is an error naming the file and line.
pub(crate) fn properties(text: &str, path: &Path) -> Result<Properties, KfdError> {
    let mut props = Properties::default();
    for (index, line) in text.lines().enumerate() {
        let mut words = line.split_whitespace();
        let Some(name) = words.next() else { continue };
        let value = match (words.next(), words.next()) {
            (Some(value), None) => value.parse::<u64>().ok(),
            _ => None,
        };
        let Some(value) = value else {
            return Err(KfdError::MalformedLine {
                path: path.to_owned(),
                line: index + 1,
                text: line.to_owned(),
            });
        };
        props.set(name, value);
    }
    Ok(props)
}

/// Parses a cache's `properties` file. It is a `properties` file except for `sibling_map`,
/// whose value is a comma-separated bit list ("1,0,0,…"); that line is skipped.
pub(crate) fn cache_properties(text: &str, path: &Path) -> Result<Properties, KfdError> {
    let kept: String = text
        .lines()
        .filter(|line| line.split_whitespace().next() != Some("sibling_map"))
        .flat_map(|line| [line, "\n"])
        .collect();
    // Line numbers in errors must match the file, so skipped lines keep their place.
    properties(&kept, path).map_err(|err| match err {
        KfdError::MalformedLine {
            path, text: bad, ..
        } => {
            let line = text.lines().position(|l| l == bad).map_or(0, |i| i + 1);
            KfdError::MalformedLine {
                path,
                line,
                text: bad,
            }
        }
        other => other,
    })
}

/// Parses a file holding one unsigned decimal number (`gpu_id`).
pub(crate) fn number(text: &str, path: &Path) -> Result<u32, KfdError> {
    text.trim()
        .parse::<u32>()
        .map_err(|_| KfdError::NotANumber {
            path: path.to_owned(),
            text: text.trim().to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_parse_every_pair() {
        let text = "cpu_cores_count 0\nsimd_count 240\n\nhive_id 18143416471259055690\n";
        let props = properties(text, Path::new("p")).unwrap();
        assert_eq!(props.get("simd_count"), Some(240));
        assert_eq!(props.get("hive_id"), Some(18_143_416_471_259_055_690));
        assert_eq!(props.value("absent"), 0);
    }

    #[test]
    fn malformed_lines_name_file_and_line() {
        for bad in ["simd_count", "simd_count x", "simd_count -1", "a 1 2"] {
            let text = format!("vendor_id 4098\n{bad}\n");
            let err = properties(&text, Path::new("/n/1/properties")).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("/n/1/properties:2"), "{msg}");
            assert!(msg.contains(bad), "{msg}");
        }
    }

    #[test]
    fn cache_sibling_map_is_skipped() {
        let text = "processor_id_low 2147487744\nlevel 2\nsize 4096\ncache_line_size 128\n\
                    type 1\nsibling_map 1,1,1,1,0,0,0,0\n";
        let props = cache_properties(text, Path::new("c")).unwrap();
        assert_eq!(props.get("level"), Some(2));
        assert_eq!(props.get("sibling_map"), None);
        let err = cache_properties("level 1\nsize big\n", Path::new("c")).unwrap_err();
        assert!(err.to_string().contains("c:2"), "{err}");
    }

    #[test]
    fn numbers() {
        assert_eq!(number("28851\n", Path::new("g")).unwrap(), 28851);
        let err = number("abc\n", Path::new("/x/gpu_id")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/x/gpu_id: expected an unsigned integer, found \"abc\""
        );
    }
}

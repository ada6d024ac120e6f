//! The container an archive holds, from the engine's `config.dump` and `spec.dump`
//! (the fields and engine rules checkpointctl uses).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The container, as `gpucr inspect ARCHIVE --json` prints it: the field names are
/// checkpointctl's.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ContainerInfo {
    pub container_name: String,
    pub image: String,
    pub id: String,
    pub runtime: String,
    pub created: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpointed: Option<String>,
    /// Podman, CRI-O or containerd.
    pub engine: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub checkpoint_size: CheckpointSize,
}

/// Sizes inside the archive, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CheckpointSize {
    /// Every file under `checkpoint/`.
    pub total_size: u64,
    /// CRIU's pages files.
    pub memory_pages_size: u64,
    /// gpucr's GPU memory (`checkpoint/gpu/`).
    pub gpu_memory_size: u64,
    /// `rootfs-diff.tar`.
    pub root_fs_diff_size: u64,
}

/// What is read of `config.dump` (podman's container config; CRI-O and containerd
/// write the same fields).
#[derive(Debug, Default, Deserialize)]
struct ConfigDump {
    #[serde(default)]
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default, rename = "rootfsImageName")]
    rootfs_image_name: String,
    #[serde(default)]
    runtime: String,
    #[serde(default, rename = "createdTime")]
    created_time: String,
    #[serde(default, rename = "checkpointedTime")]
    checkpointed_time: String,
}

/// Why `config.dump` or `spec.dump` cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error("{file}: not valid JSON: {source}")]
    Json {
        file: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl ContainerError {
    /// The archive member the error is about.
    pub fn file(&self) -> &'static str {
        match self {
            ContainerError::Json { file, .. } => file,
        }
    }
}

/// The container described by `config` (config.dump) and `spec` (spec.dump, the OCI
/// runtime spec); either may be absent. A file that is not valid JSON is reported and
/// read as absent, so that what the other one says is still shown.
pub fn container_info(
    config: Option<&[u8]>,
    spec: Option<&[u8]>,
) -> (ContainerInfo, Vec<ContainerError>) {
    let mut errors = Vec::new();
    let config: ConfigDump = parse(config, super::CONFIG_DUMP, &mut errors).unwrap_or_default();
    let spec: Value = parse(spec, super::SPEC_DUMP, &mut errors).unwrap_or(Value::Null);
    (describe(config, &spec), errors)
}

/// `bytes` (the member `file`) as JSON; None when absent or, with the error kept in
/// `errors`, not valid.
fn parse<T: serde::de::DeserializeOwned>(
    bytes: Option<&[u8]>,
    file: &'static str,
    errors: &mut Vec<ContainerError>,
) -> Option<T> {
    serde_json::from_slice(bytes?)
        .map_err(|source| errors.push(ContainerError::Json { file, source }))
        .ok()
}

/// The container `config` and `spec` describe, by the rules of the engine that wrote
/// them.
fn describe(config: ConfigDump, spec: &Value) -> ContainerInfo {
    let annotation = |key: &str| {
        spec.get("annotations")
            .and_then(|a| a.get(key))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let mut info = ContainerInfo {
        image: config.rootfs_image_name,
        id: config.id,
        runtime: config.runtime,
        created: config.created_time,
        checkpointed: (!config.checkpointed_time.is_empty()
            && !config.checkpointed_time.starts_with("0001-"))
        .then_some(config.checkpointed_time),
        ..ContainerInfo::default()
    };
    match annotation("io.container.manager").as_deref() {
        Some("libpod") => {
            info.engine = "Podman".into();
            info.container_name = config.name;
        }
        Some("cri-o") => {
            info.engine = "CRI-O".into();
            info.container_name = annotation("io.kubernetes.cri-o.Metadata")
                .and_then(|m| serde_json::from_str::<Value>(&m).ok())
                .and_then(|m| m.get("name").and_then(Value::as_str).map(str::to_string))
                .unwrap_or(config.name);
            info.ip = annotation("io.kubernetes.cri-o.IP.0");
            if let Some(created) = annotation("io.kubernetes.cri-o.Created") {
                info.created = created;
            }
            info.namespace = annotation("io.kubernetes.pod.namespace");
            info.pod = annotation("io.kubernetes.pod.name");
        }
        _ => {
            info.engine = "containerd".into();
            info.container_name =
                annotation("io.kubernetes.cri.container-name").unwrap_or(config.name);
            info.namespace = annotation("io.kubernetes.cri.sandbox-namespace");
            info.pod = annotation("io.kubernetes.cri.sandbox-name");
        }
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podman_config_and_spec() {
        let config = br#"{"id":"f11d11844af0aa","name":"counter","rootfsImageName":"localhost/sim:latest",
            "runtime":"runc","createdTime":"2026-11-23T09:00:00Z","checkpointedTime":"2026-11-23T09:01:00Z"}"#;
        let spec = br#"{"annotations":{"io.container.manager":"libpod"}}"#;
        let (info, errors) = container_info(Some(config), Some(spec));
        assert!(errors.is_empty());
        assert_eq!(info.engine, "Podman");
        assert_eq!(info.container_name, "counter");
        assert_eq!(info.image, "localhost/sim:latest");
        assert_eq!(info.runtime, "runc");
        assert_eq!(info.checkpointed.as_deref(), Some("2026-11-23T09:01:00Z"));
    }

    #[test]
    fn cri_o_and_containerd_names_come_from_annotations() {
        let spec = br#"{"annotations":{"io.container.manager":"cri-o",
            "io.kubernetes.cri-o.Metadata":"{\"name\":\"counter\"}",
            "io.kubernetes.pod.name":"counters","io.kubernetes.pod.namespace":"default",
            "io.kubernetes.cri-o.IP.0":"10.0.0.5"}}"#;
        let (info, _) = container_info(Some(b"{\"id\":\"abc\"}"), Some(spec));
        assert_eq!(info.engine, "CRI-O");
        assert_eq!(info.container_name, "counter");
        assert_eq!(info.pod.as_deref(), Some("counters"));
        assert_eq!(info.ip.as_deref(), Some("10.0.0.5"));
        let spec = br#"{"annotations":{"io.kubernetes.cri.container-name":"c1",
            "io.kubernetes.cri.sandbox-name":"p1"}}"#;
        let (info, _) = container_info(None, Some(spec));
        assert_eq!(info.engine, "containerd");
        assert_eq!(info.container_name, "c1");
        assert_eq!(info.pod.as_deref(), Some("p1"));
    }

    #[test]
    fn malformed_json_names_the_file_and_the_other_is_still_read() {
        let spec = br#"{"annotations":{"io.container.manager":"libpod"}}"#;
        let (info, errors) = container_info(Some(b"{"), Some(spec));
        assert_eq!(errors.len(), 1);
        let err = errors[0].to_string();
        assert!(err.starts_with("config.dump: not valid JSON"), "{err}");
        assert_eq!(info.engine, "Podman");
        let (info, errors) = container_info(Some(b"{\"id\":\"abc\"}"), Some(b"x"));
        assert!(
            errors[0].to_string().starts_with("spec.dump: "),
            "{:?}",
            errors
        );
        assert_eq!(info.id, "abc");
    }
}

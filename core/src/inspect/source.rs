//! Where `gpucr inspect` reads an image from: a directory, or the files of a checkpoint
//! archive held in memory (see [`crate::archive`]).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpucr_criu_image::store::MemoryFiles;
use gpucr_criu_image::ImageDir;

use crate::image::{dir as image_dir, INCOMPLETE_FILE, MANIFEST_FILE};

/// An image: a directory, or files read from an archive.
#[derive(Debug, Clone)]
pub struct ImageSource {
    /// The directory, or the archive's path joined with `checkpoint` (named in errors).
    root: PathBuf,
    archive: Option<ArchiveFiles>,
}

/// The files of an image read from an archive.
#[derive(Debug, Clone)]
struct ArchiveFiles {
    /// The files kept in memory (whole, or the few pages a view needs).
    memory: Arc<MemoryFiles>,
    /// Every file of the image with its size, kept or not, sorted.
    sizes: Vec<(String, u64)>,
}

impl ImageSource {
    /// The image directory `dir`.
    pub fn dir(dir: &Path) -> ImageSource {
        ImageSource {
            root: dir.to_path_buf(),
            archive: None,
        }
    }

    /// Files read from an archive: `memory` holds those kept, `sizes` lists every file.
    pub fn archive(root: PathBuf, memory: Arc<MemoryFiles>, sizes: Vec<(String, u64)>) -> Self {
        ImageSource {
            root,
            archive: Some(ArchiveFiles { memory, sizes }),
        }
    }

    /// The directory (or the archive's image directory), as errors name it.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the image was read from an archive.
    pub fn is_archive(&self) -> bool {
        self.archive.is_some()
    }

    /// Whether there is an image to read at all.
    pub fn exists(&self) -> bool {
        self.archive.is_some() || self.root.is_dir()
    }

    /// CRIU's images.
    pub fn images(&self, page_size: u64) -> ImageDir {
        match &self.archive {
            Some(a) => ImageDir::in_memory(&self.root, page_size, a.memory.clone()),
            None => ImageDir::new(&self.root, page_size),
        }
    }

    /// The whole content of the small file `name` (the manifest, the GPU index); an
    /// error of kind NotFound when the image has no such file.
    pub fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        match &self.archive {
            None => gpucr_criu_image::store::read_regular(&self.root.join(name)),
            Some(a) => {
                let file = a
                    .memory
                    .get(name)
                    .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
                let mut bytes = vec![0u8; file.size() as usize];
                gpucr_criu_image::store::Source::Memory(file.clone())
                    .read_exact_at(&mut bytes, 0)?;
                Ok(bytes)
            }
        }
    }

    /// Whether the image has a file below the directory `name` (`gpu`).
    pub fn has_dir(&self, name: &str) -> bool {
        match &self.archive {
            None => self.root.join(name).is_dir(),
            Some(a) => {
                let prefix = format!("{name}/");
                a.sizes.iter().any(|(n, _)| n.starts_with(&prefix))
            }
        }
    }

    /// The reason a failed dump recorded in `gpucr-incomplete.json`, if there is one.
    pub fn incomplete_reason(&self) -> Option<String> {
        match &self.archive {
            None => image_dir::incomplete_reason(&self.root),
            Some(_) => {
                let text = self.read(INCOMPLETE_FILE).ok()?;
                let value: serde_json::Value = serde_json::from_slice(&text).ok()?;
                Some(value.get("reason")?.as_str()?.to_owned())
            }
        }
    }

    /// Whether the image has the file `name`.
    pub fn has_file(&self, name: &str) -> bool {
        match &self.archive {
            None => self.root.join(name).is_file(),
            Some(a) => a.sizes.iter().any(|(n, _)| n == name),
        }
    }

    /// Every file of the image (the manifest and incomplete marker included) with its
    /// size.
    pub fn file_sizes(&self) -> Vec<(String, u64)> {
        match &self.archive {
            Some(a) => a.sizes.clone(),
            None => {
                let mut names = image_dir::image_files(&self.root).unwrap_or_default();
                for extra in [MANIFEST_FILE, INCOMPLETE_FILE] {
                    if self.root.join(extra).is_file() {
                        names.push(extra.to_string());
                    }
                }
                names
                    .into_iter()
                    .filter_map(|name| {
                        let size = fs::metadata(self.root.join(&name)).ok()?.len();
                        Some((name, size))
                    })
                    .collect()
            }
        }
    }
}

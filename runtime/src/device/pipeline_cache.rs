//! Compiled pipelines kept on disk between processes, where the backend has a pipeline
//! cache (Vulkan's `VkPipelineCache`): a second process skips the driver's compile.
//!
//! The file lives in a directory the caller chooses ([`Gpu::with_pipeline_cache`]); the
//! runtime's own constructor uses [`PIPELINE_CACHE_ENV`] when set (a directory, or `off`)
//! and [`default_pipeline_cache_dir`] otherwise. The file is named by wgpu's
//! `pipeline_cache_key` (backend, vendor and device), and a driver that does not accept
//! old data starts an empty cache.

use std::path::{Path, PathBuf};

use super::Gpu;

/// The environment variable naming the pipeline cache's directory, or `off`.
pub const PIPELINE_CACHE_ENV: &str = "ATTN_PIPELINE_CACHE";

/// `$XDG_CACHE_HOME/attn-webgpu`, else `$HOME/.cache/attn-webgpu`.
pub fn default_pipeline_cache_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".cache"),
    };
    Some(base.join("attn-webgpu"))
}

/// The directory [`PIPELINE_CACHE_ENV`] names, the default where it is unset, none where
/// it is `off`.
pub(super) fn dir_from_env() -> Option<PathBuf> {
    match std::env::var_os(PIPELINE_CACHE_ENV) {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => default_pipeline_cache_dir(),
    }
}

/// A device's pipeline cache and the file it is saved to.
pub struct PipelineCacheFile {
    pub(super) cache: wgpu::PipelineCache,
    path: PathBuf,
    /// Bytes loaded from the file (0: a cold start).
    pub loaded: usize,
}

impl PipelineCacheFile {
    /// The file the cache is loaded from and saved to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Gpu {
    /// Keeps compiled pipelines in `dir` (created when missing), loading what an earlier
    /// process saved there; `None` turns the cache off. Without the PIPELINE_CACHE feature
    /// on the device, or on a backend without pipeline caches, nothing is cached. Call it
    /// before the first op compiles: earlier pipelines are not in the cache.
    pub fn with_pipeline_cache(mut self, dir: Option<&Path>) -> Gpu {
        self.pipeline_cache = dir.and_then(|dir| self.open_pipeline_cache(dir));
        self
    }

    fn open_pipeline_cache(&self, dir: &Path) -> Option<PipelineCacheFile> {
        if !self.features.contains(wgpu::Features::PIPELINE_CACHE) {
            return None;
        }
        let path = dir.join(wgpu::util::pipeline_cache_key(&self.info)?);
        let data = std::fs::read(&path).ok();
        // SAFETY: `data` is what `get_data` returned in an earlier process, saved under
        // this adapter's `pipeline_cache_key`; a driver that rejects it falls back to an
        // empty cache (`fallback: true`).
        let cache = unsafe {
            self.device
                .create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                    label: Some("attn pipelines"),
                    data: data.as_deref(),
                    fallback: true,
                })
        };
        Some(PipelineCacheFile {
            cache,
            path,
            loaded: data.map_or(0, |d| d.len()),
        })
    }

    /// The pipeline cache and its file, where there is one.
    pub fn pipeline_cache(&self) -> Option<&PipelineCacheFile> {
        self.pipeline_cache.as_ref()
    }

    pub(crate) fn wgpu_pipeline_cache(&self) -> Option<&wgpu::PipelineCache> {
        self.pipeline_cache.as_ref().map(|p| &p.cache)
    }

    /// Writes the pipeline cache to its file (through a temporary file, so a reader never
    /// sees half of it). Dropping the Gpu saves it too, ignoring errors.
    pub fn save_pipeline_cache(&self) -> std::io::Result<()> {
        let Some(file) = &self.pipeline_cache else {
            return Ok(());
        };
        let Some(data) = file.cache.get_data() else {
            return Ok(());
        };
        if let Some(dir) = file.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let temp = file
            .path
            .with_extension(format!("{}.tmp", std::process::id()));
        std::fs::write(&temp, &data)?;
        std::fs::rename(&temp, &file.path)
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if self.pipelines_created() > 0 {
            let _ = self.save_pipeline_cache();
        }
    }
}

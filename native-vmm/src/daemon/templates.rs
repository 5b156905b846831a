//! The templates a daemon serves: `serve --templates DIR` holds one folder per template, each
//! an image directory written by `sandfork-vmm image build`. The folder's name is the template's
//! name; the image's own name says which language runtime it holds. A folder may also hold the
//! template's snapshot (`template.sfsnap`, written there by `sandfork-vmm template build`):
//! VMs are then restored from it instead of booted. A folder a session was saved as
//! (`Sessions::save_template`) also holds `SAVED_SESSION_FILE`: its snapshot is the session's
//! state, which no build can make again from the image.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::agent::{AgentCommand, NODE_AGENT, PYTHON_AGENT};
use crate::fs::Image;
use crate::image::sha256;
use crate::snapshot;

/// In a template folder saved from a session: which session and template it came from (JSON).
/// Such a folder's snapshot is never rebuilt; one that no longer verifies (another snapshot
/// format) is left out at the start, with a log line, instead of stopping the daemon.
pub const SAVED_SESSION_FILE: &str = "saved-session.json";

/// A language runtime a template can hold, and how code is handed to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Python,
    /// Node.js: JavaScript, and TypeScript transpiled in the VM (templates/node).
    Node,
}

/// Every runtime, for listings and messages.
pub const LANGUAGES: [Language; 2] = [Language::Python, Language::Node];

impl Language {
    /// The language of an image named `image_name` (the manifest's `name`).
    pub fn of_image(image_name: &str) -> Option<Language> {
        LANGUAGES.into_iter().find(|l| l.name() == image_name)
    }

    /// The runtime's name: its image's name, and the template's `language` in listings.
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Node => "node",
        }
    }

    /// The languages a request may run on this runtime; the first is the default.
    pub fn languages(self) -> &'static [&'static str] {
        match self {
            Language::Python => &["python"],
            Language::Node => &["javascript", "typescript"],
        }
    }

    /// How this language's agent is started.
    pub fn agent(self) -> &'static AgentCommand {
        match self {
            Language::Python => &PYTHON_AGENT,
            Language::Node => &NODE_AGENT,
        }
    }

    /// The script a request runs when it names none (argv[0], relative to /work).
    pub fn default_script(self) -> &'static str {
        match self {
            Language::Python => crate::agent::DEFAULT_SCRIPT,
            Language::Node => crate::agent::NODE_DEFAULT_SCRIPT,
        }
    }

    /// The guest memory a template of this runtime is built with by default, in MiB: the
    /// guest's address space is its memory, and V8 reserves 512 MiB of it for JIT code at
    /// start-up (its code range; reserved, not touched), so Node needs more than Python's 256.
    pub fn default_memory_mib(self) -> u64 {
        match self {
            Language::Python => crate::vm::DEFAULT_MEM_BYTES >> 20,
            Language::Node => 1024,
        }
    }
}

/// The runtimes' names, for messages ("python, node").
pub fn known_languages() -> String {
    LANGUAGES.map(Language::name).join(", ")
}

/// One template: its image, opened and checked.
pub struct Template {
    pub name: String,
    pub language: Language,
    pub image: Arc<Image>,
    /// Hex SHA-256 of the image (`Image::content_hash`).
    pub content_hash: String,
    /// The verified snapshot of the agent at its ready point, when the folder has one.
    pub snapshot: Option<Arc<snapshot::Template>>,
}

#[derive(Debug)]
pub enum TemplateError {
    /// The templates directory cannot be listed.
    Directory { dir: PathBuf, error: io::Error },
    /// A template folder does not hold a valid image.
    Image { dir: PathBuf, error: io::Error },
    /// The image's name is not a language this daemon can run.
    UnknownLanguage { dir: PathBuf, image_name: String },
    /// The folder's snapshot is damaged or was built from another image or agent.
    Snapshot {
        dir: PathBuf,
        error: snapshot::TemplateError,
    },
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateError::Directory { dir, error } => {
                write!(f, "listing templates in {}: {error}", dir.display())
            }
            TemplateError::Image { dir, error } => write!(f, "template {}: {error}", dir.display()),
            TemplateError::UnknownLanguage { dir, image_name } => {
                write!(f, "template {}: its image is named '{image_name}', which is not a known language ({})", dir.display(), known_languages())
            }
            TemplateError::Snapshot { dir, error } => {
                write!(f, "template {}: {error}", dir.display())
            }
        }
    }
}

impl std::error::Error for TemplateError {}

/// Opens every template folder in `dir` (sorted by name). Entries whose names start with '.'
/// and entries that are not directories are skipped; a folder that is not a valid image of a
/// known language is an error (a daemon with a broken template should not start quietly).
pub fn load(dir: &Path) -> Result<Vec<Template>, TemplateError> {
    let listing = |error| TemplateError::Directory {
        dir: dir.to_owned(),
        error,
    };
    let mut folders = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(listing)? {
        let entry = entry.map_err(listing)?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        // Follows symlinks: a template folder may link to an image built elsewhere.
        if name.starts_with('.') || !entry.path().is_dir() {
            continue;
        }
        folders.push(name);
    }
    folders.sort();
    let mut templates = Vec::with_capacity(folders.len());
    for name in &folders {
        match load_one(dir, name) {
            Err(error @ TemplateError::Snapshot { .. })
                if dir.join(name).join(SAVED_SESSION_FILE).exists() =>
            {
                super::log(format_args!(
                    "left out a template saved from a session: {error}"
                ));
            }
            loaded => templates.push(loaded?),
        }
    }
    Ok(templates)
}

/// The template of folder `dir` alone, loaded as the daemon loads each of its templates.
pub fn load_folder(dir: &Path) -> Result<Template, String> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name().and_then(|n| n.to_str()))
    else {
        return Err(format!("{} is not a template folder", dir.display()));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    load_one(parent, name).map_err(|e| e.to_string())
}

/// Opens template folder `dir`/`name` (for `serve` at start, and `load_template` after).
pub fn load_one(dir: &Path, name: &str) -> Result<Template, TemplateError> {
    let path = dir.join(name);
    let image = Image::open(&path).map_err(|error| TemplateError::Image {
        dir: path.clone(),
        error,
    })?;
    let language =
        Language::of_image(image.name()).ok_or_else(|| TemplateError::UnknownLanguage {
            dir: path.clone(),
            image_name: image.name().to_owned(),
        })?;
    let content_hash = sha256::to_hex(&image.content_hash());
    let snapshot = load_snapshot(&path, &image, language)?;
    Ok(Template {
        name: name.to_owned(),
        language,
        image,
        content_hash,
        snapshot,
    })
}

/// A name `load_template` may open under the templates folder: one folder name (ASCII letters,
/// digits, '-', '_', '.', '@'), not hidden (the builds in progress are), at most
/// MAX_TEMPLATE_NAME_BYTES.
pub fn check_folder_name(name: &str) -> Result<(), String> {
    let allowed = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'@');
    if name.is_empty()
        || name.len() > crate::daemon::wire::MAX_TEMPLATE_NAME_BYTES
        || name.starts_with('.')
        || !name.bytes().all(allowed)
    {
        return Err(format!(
            "name must be 1 to {} ASCII letters, digits, '-', '_', '.' or '@', not starting with '.'",
            crate::daemon::wire::MAX_TEMPLATE_NAME_BYTES
        ));
    }
    Ok(())
}

/// Puts the image of template folder `from` into folder `to` (which exists), as hard links: an
/// image build never changes a file in place (it writes new files and renames them over the
/// old), so a link keeps these bytes whatever later becomes of `from`. Across file systems
/// (a folder that links to an image built elsewhere) the files are copied instead.
pub fn link_image(from: &Path, to: &Path) -> io::Result<()> {
    for file in [
        crate::image::format::INDEX_FILE,
        crate::image::format::DATA_FILE,
    ] {
        let (source, target) = (from.join(file), to.join(file));
        match std::fs::hard_link(&source, &target) {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => copy_file(&source, &target)?,
            linked => linked?,
        }
    }
    Ok(())
}

/// Copies `source` to `target` (created) with plain reads and writes, synced: the daemon's
/// seccomp filter allows neither copy_file_range nor sendfile, which `std::fs::copy` tries.
fn copy_file(source: &Path, target: &Path) -> io::Result<()> {
    use std::io::{Read, Write};
    let mut from = std::fs::File::open(source)?;
    let mut to = std::fs::File::create(target)?;
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = from.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        to.write_all(&buffer[..n])?;
    }
    to.sync_all()
}

/// The snapshot in template folder `dir`, verified against its image and agent; None when the
/// folder has none (its VMs are then booted).
fn load_snapshot(
    dir: &Path,
    image: &Arc<Image>,
    language: Language,
) -> Result<Option<Arc<snapshot::Template>>, TemplateError> {
    if !dir.join(snapshot::TEMPLATE_FILE).exists() {
        return Ok(None);
    }
    match snapshot::Template::load(dir, image.clone(), language.agent()) {
        Ok(template) => Ok(Some(Arc::new(template))),
        Err(error) => Err(TemplateError::Snapshot {
            dir: dir.to_owned(),
            error,
        }),
    }
}

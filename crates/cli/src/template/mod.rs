//! `sandkasten template`: `check FILE` (a spec or Dockerfile, exit 0 or 2 naming the field), `build FILE` (each step
//! in a build sandbox, layers cached), `list`, `rm NAME` (with garbage collection of unused layers), `gc`, `push NAME`
//! and `pull NAME` (to and from the template store beside the snapshot store), `prune` (old versions out of the
//! store). A layer
//! that a sandbox on this host reads (its runtime record names it) outlives its template until a later `rm` or `gc`.

mod build;
mod share;

use std::path::PathBuf;

use clap::{Args, Subcommand};
use sandkasten_template::{TemplateCache, cache::DEFAULT_ROOT};

use crate::exit_codes;

/// Arguments of `sandkasten template`.
#[derive(Debug, Args)]
pub struct TemplateArgs {
    /// The template cache (layers and templates). Default /var/lib/sandkasten/templates.
    #[arg(long, value_name = "DIR", env = "SANDKASTEN_TEMPLATES", global = true)]
    pub cache: Option<PathBuf>,
    #[command(subcommand)]
    pub command: TemplateCommand,
}

/// The template subcommands.
#[derive(Debug, Subcommand)]
pub enum TemplateCommand {
    /// Check a spec (TOML) or a Dockerfile: exit 0, or 2 naming the field or line and how to fix it.
    Check {
        /// The spec (`template.toml`) or a `Dockerfile`.
        file: PathBuf,
        /// The template's name (a Dockerfile's default: its directory's name).
        #[arg(long)]
        name: Option<String>,
    },
    /// Build a template: each step in a build sandbox that reaches only the package registries; unchanged steps
    /// come from the cache.
    Build(build::BuildArgs),
    /// List the templates: name, digest, size, created.
    List {
        /// One JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Remove a template, then every layer no template uses and no sandbox reads.
    Rm {
        /// The template's name.
        name: String,
    },
    /// Remove every layer no template uses and no sandbox reads (those of templates removed while their sandboxes
    /// ran), and what unfinished builds left.
    Gc,
    /// Copy a built template into the template store beside the snapshot store (`[snapshots] store` of --config,
    /// else the server's default), so other hosts can pull it. The cache is --cache, else `[templates] cache` of
    /// --config.
    Push {
        /// The template's name.
        name: String,
        /// The server's config file: its `[snapshots]` settings name the store.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Copy the newest version of a template from the template store into the cache (--cache, else `[templates]
    /// cache` of --config, which a server with that config reads).
    Pull {
        /// The template's name.
        name: String,
        /// The server's config file: its `[snapshots]` settings name the store.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Delete old versions from the template store: of each template (or of the ones named) the newest --keep stay;
    /// then the chunks nothing references go, once past the store's grace period (`[snapshots] gc_grace_s`).
    Prune {
        /// Only these templates (default: every template in the store).
        names: Vec<String>,
        /// How many of each template's newest versions stay (0 deletes the named templates from the store; it needs
        /// names).
        #[arg(long, default_value_t = 3)]
        keep: usize,
        /// The server's config file: its `[snapshots]` settings name the store.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `sandkasten template …` and returns the exit code.
pub fn run(args: TemplateArgs) -> i32 {
    let root = args.cache.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT));
    match args.command {
        TemplateCommand::Check { file, name } => match sandkasten_template::read_spec(&file, name.as_deref()) {
            Ok(spec) => {
                println!("{}: template {:?} on {} is valid", file.display(), spec.name, spec.base);
                0
            }
            Err(error) => {
                eprintln!("sandkasten: {}: {error}", file.display());
                exit_codes::BAD_INPUT
            }
        },
        TemplateCommand::Build(build_args) => build::run(&root, &build_args),
        TemplateCommand::List { json } => list(&root, json),
        TemplateCommand::Rm { name } => remove(&root, Some(&name)),
        TemplateCommand::Gc => remove(&root, None),
        TemplateCommand::Push { name, config } => share::run(args.cache.as_deref(), &name, config.as_ref(), true),
        TemplateCommand::Pull { name, config } => share::run(args.cache.as_deref(), &name, config.as_ref(), false),
        TemplateCommand::Prune { names, keep, config, json } => share::prune(&names, keep, config.as_ref(), json),
    }
}

/// The layer directories the sandboxes on this host read (their runtime records name them).
fn layers_in_use() -> std::collections::HashSet<PathBuf> {
    sandkasten_runtime::records::layers_in_use(&sandkasten_runtime::RuntimeConfig::default().records_dir())
}

fn open(root: &std::path::Path) -> Result<TemplateCache, i32> {
    TemplateCache::open(root).map_err(|error| {
        eprintln!("sandkasten: the template cache: {error}");
        exit_codes::SANDBOX_ERROR
    })
}

fn list(root: &std::path::Path, json: bool) -> i32 {
    let cache = match open(root) {
        Ok(cache) => cache,
        Err(code) => return code,
    };
    let templates = match cache.templates() {
        Ok(templates) => templates,
        Err(error) => {
            eprintln!("sandkasten: listing templates: {error}");
            return exit_codes::SANDBOX_ERROR;
        }
    };
    if json {
        println!("{}", serde_json::to_string(&templates).unwrap_or_else(|_| "[]".to_owned()));
        return 0;
    }
    println!("{:<24} {:<20} {:>10}  CREATED", "NAME", "DIGEST", "SIZE");
    for template in templates {
        let short: String = template.digest.chars().take(19).collect();
        let size = indicatif::HumanBytes(template.size_bytes).to_string();
        println!("{:<24} {short:<20} {size:>10}  {}", template.name, template.created);
    }
    0
}

/// `rm NAME` (`name`), or `gc` (none).
fn remove(root: &std::path::Path, name: Option<&str>) -> i32 {
    let cache = match open(root) {
        Ok(cache) => cache,
        Err(code) => return code,
    };
    let _lock = match build::lock(&cache) {
        Ok(lock) => lock,
        Err(code) => return code,
    };
    let in_use = layers_in_use();
    let removed = match name {
        Some(name) => cache.remove_template(name, &in_use),
        None => cache.collect_garbage(&in_use),
    };
    let name = name.unwrap_or("nothing");
    match removed {
        Ok(report) => {
            let kept = match report.layers_in_use {
                0 => String::new(),
                n => format!("; {n} kept while sandboxes read them: `sandkasten template gc` once they ended"),
            };
            println!("removed {name} ({} unused layers removed{kept})", report.layers_removed);
            0
        }
        Err(error @ sandkasten_template::CacheError::UnknownTemplate(_)) => {
            eprintln!("sandkasten: {error}");
            exit_codes::BAD_INPUT
        }
        Err(error) => {
            eprintln!("sandkasten: removing {name}: {error}");
            exit_codes::SANDBOX_ERROR
        }
    }
}

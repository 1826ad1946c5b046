//! API tests: the router driven in-process over an in-memory SQLite store and a fake runtime.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fake;
mod fake_commands;
mod harness;
mod imports;

mod archive;
mod auth;
mod auto_isolation;
mod background;
mod bad_input;
mod code;
mod config;
mod e2b;
mod e2b_files;
mod exec;
mod files;
mod isolation;
mod layering;
mod lifecycle;
mod logs;
mod metrics;
mod openapi;
mod pause_files;
mod pools;
mod quotas;
mod run;
mod scan;
mod secrets_at_rest;
mod snapshots;
mod tcp;
mod templates;
mod tier_results;
mod tiers;
mod usage;

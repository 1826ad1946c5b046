//! Reading a config file with every problem in it, not just the first: the TOML is parsed with its spans, then
//! walked against the config's own JSON schema (`schema`, derived from the types), which finds every unknown key
//! (with a "did you mean" when one is close), every value of the wrong type and every unknown name (a tier, a mode),
//! each at its key path, line and column. Bad values are dropped (or, where the file must have one, replaced by a
//! placeholder) so the rest still deserializes and the semantic checks (`ServerConfig::problems`) run too; their
//! problems are placed at the line of their key, and those under a dropped value are not reported twice.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::Deserialize;
use serde_json::Value as Schema;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::config::problem::{ConfigError, Problem, Problems};
use crate::config::schema::json_schema;
use crate::config::server::ServerConfig;

/// A config file's text, read with every structural problem, and what locates later problems in it.
pub(crate) struct Parsed<'t> {
    text: &'t str,
    /// The config the file describes, bad values left out; `None` when not even that deserializes.
    config: Option<ServerConfig>,
    /// Syntax and structure problems, placed in the file.
    problems: Vec<Problem>,
    /// Paths whose value was dropped or replaced: later problems at or under them are consequences.
    replaced: Vec<String>,
    /// Where each key path sits in the text (a key's span; an array item's own).
    keys: BTreeMap<String, Range<usize>>,
    /// Every value's span with its path (to place errors serde reports by span).
    values: Vec<(String, Range<usize>)>,
}

impl<'t> Parsed<'t> {
    /// Parses and checks `text`.
    pub(crate) fn new(text: &'t str) -> Parsed<'t> {
        let mut parsed = Parsed {
            text,
            config: None,
            problems: Vec::new(),
            replaced: Vec::new(),
            keys: BTreeMap::new(),
            values: Vec::new(),
        };
        let (document, errors) = DeTable::parse_recoverable(text);
        if !errors.is_empty() {
            for error in errors {
                let problem = Problem::new("", format!("invalid TOML: {}", error.message().trim_end()));
                parsed.problems.push(parsed.placed_at(problem, error.span().map(|span| span.start)));
            }
            return parsed;
        }
        let schema = json_schema();
        let mut walk = Walk { root: &schema, problems: Vec::new(), parsed: &mut parsed };
        let cleaned = walk.table(document.get_ref(), &schema, "");
        let found = std::mem::take(&mut walk.problems);
        parsed.problems = found;
        match ServerConfig::deserialize(toml::Value::Table(cleaned)) {
            Ok(config) => parsed.config = Some(config),
            Err(error) => {
                // The schema let something through that serde refuses: report serde's own error on the text.
                let problem = match toml::from_str::<ServerConfig>(text) {
                    Err(located) => {
                        let at = located.span().map(|span| span.start);
                        let path = at.map(|offset| parsed.path_at(offset)).unwrap_or_default();
                        parsed.placed_at(Problem::new(path, located.message().trim_end()), at)
                    }
                    Ok(_) => Problem::new("", error.message().trim_end()),
                };
                parsed.problems.push(problem);
            }
        }
        parsed
    }

    /// The config, if the file had no structural problem (semantic ones are `ServerConfig::problems`).
    pub(crate) fn into_config(self) -> Result<ServerConfig, ConfigError> {
        match (self.config, self.problems.is_empty()) {
            (Some(config), true) => Ok(config),
            (_, _) => Err(ConfigError::Invalid(Problems::new(self.problems))),
        }
    }

    /// The config with the bad values left out (defaults when none deserializes), and the structural problems.
    pub(crate) fn tolerant(&self) -> (ServerConfig, Vec<Problem>) {
        (self.config.clone().unwrap_or_default(), self.problems.clone())
    }

    /// Later problems (semantic ones, of the config [`Parsed::tolerant`] gave) placed at their keys' lines, without
    /// those that follow from a value already reported.
    pub(crate) fn place(&self, problems: Vec<Problem>) -> Vec<Problem> {
        problems
            .into_iter()
            .filter(|problem| !self.covers(&problem.path))
            .map(|problem| {
                let mut path = problem.path.as_str();
                let at = loop {
                    if let Some(span) = self.keys.get(path) {
                        break Some(span.start);
                    }
                    match parent(path) {
                        Some(up) => path = up,
                        None => break None,
                    }
                };
                self.placed_at(problem, at)
            })
            .collect()
    }

    /// Whether a problem at `path` may follow from a value already reported: one at or under it (the problem is
    /// about a dropped value), or one above it that is a table (a problem about a whole table, part of which was
    /// dropped).
    fn covers(&self, path: &str) -> bool {
        let within = |inner: &str, outer: &str| {
            inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
        };
        self.config.is_none()
            || self.replaced.iter().any(|replaced| {
                within(path, replaced) || (within(replaced, path) && self.keys.contains_key(path) && !path.is_empty())
            })
    }

    /// The path of the innermost value whose span holds `offset`.
    fn path_at(&self, offset: usize) -> String {
        let holding = self.values.iter().filter(|(_, span)| span.contains(&offset));
        holding.min_by_key(|(_, span)| span.len()).map(|(path, _)| path.clone()).unwrap_or_default()
    }

    fn placed_at(&self, mut problem: Problem, offset: Option<usize>) -> Problem {
        if let Some(offset) = offset {
            let before = &self.text[..offset.min(self.text.len())];
            let line_start = before.rfind('\n').map_or(0, |newline| newline + 1);
            problem.line = Some(before.matches('\n').count() + 1);
            problem.column = Some(before[line_start..].chars().count() + 1);
        }
        problem
    }
}

/// Orders problems as the file does; those without a line last, in the order found.
pub(crate) fn sort(problems: &mut [Problem]) {
    problems.sort_by_key(|problem| (problem.line.unwrap_or(usize::MAX), problem.column.unwrap_or(0)));
}

/// The path one level up (`pools[0].limits` → `pools[0]` → `pools`), `None` at the top.
fn parent(path: &str) -> Option<&str> {
    if path.is_empty() {
        return None;
    }
    let cut = if path.ends_with(']') {
        path.rfind('[')
    } else if let Some(open) = path.strip_suffix('"') {
        open.rfind('"').map(|quote| quote.saturating_sub(1))
    } else {
        Some(path.rfind('.').unwrap_or(0))
    };
    cut.map(|at| &path[..at])
}

/// `path.key`, the key quoted when it is not bare.
fn join(path: &str, key: &str) -> String {
    let bare = !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let key = if bare { key.to_owned() } else { format!("{key:?}") };
    if path.is_empty() { key } else { format!("{path}.{key}") }
}

/// One walk of a document against the schema.
struct Walk<'s, 'p, 't> {
    root: &'s Schema,
    problems: Vec<Problem>,
    parsed: &'p mut Parsed<'t>,
}

impl<'s> Walk<'s, '_, '_> {
    fn problem(&mut self, path: &str, offset: usize, message: impl std::fmt::Display) {
        let problem = self.parsed.placed_at(Problem::new(path, message), Some(offset));
        self.problems.push(problem);
    }

    /// The schema `$ref` points at (followed to the end), and the name of the last definition followed.
    fn resolve(&self, mut schema: &'s Schema) -> (&'s Schema, Option<&'s str>) {
        let mut name = None;
        while let Some(reference) = schema.get("$ref").and_then(Schema::as_str) {
            let Some(definition) = reference.strip_prefix("#/$defs/") else { break };
            let Some(target) = self.root.get("$defs").and_then(|defs| defs.get(definition)) else { break };
            (schema, name) = (target, Some(definition));
        }
        (schema, name)
    }

    /// The names a value of this schema may take, when it is a choice of names (an enum).
    fn choices(&self, schema: &'s Schema) -> Option<Vec<&'s str>> {
        if let Some(names) = schema.get("enum").and_then(Schema::as_array) {
            return names.iter().map(Schema::as_str).collect();
        }
        let alternatives = alternatives(schema);
        if alternatives.is_empty() {
            return None;
        }
        let name = |alternative: &&'s Schema| {
            let (alternative, _) = self.resolve(alternative);
            alternative.get("const").and_then(Schema::as_str)
        };
        alternatives.iter().map(name).collect()
    }

    /// Checks one value; its cleaned copy, or `None` when it is bad (the problem is recorded).
    fn value(&mut self, item: &Spanned<DeValue<'_>>, schema: &'s Schema, path: &str) -> Option<toml::Value> {
        self.parsed.values.push((path.to_owned(), item.span()));
        let (schema, name) = self.resolve(schema);
        let offset = item.span().start;
        if let Some(names) = self.choices(schema) {
            return self.choice(item.get_ref(), &names, name, path, offset);
        }
        let alternatives = alternatives(schema);
        if let Some(first) = alternatives.first() {
            let fits = alternatives.iter().find(|alternative| fits(self.resolve(alternative).0, item.get_ref()));
            return self.value(item, fits.unwrap_or(first), path);
        }
        let expected = types(schema);
        if !expected.is_empty() && !expected.iter().any(|kind| matches(kind, item.get_ref())) {
            let expected: Vec<&str> = expected.iter().map(|kind| article(kind)).collect();
            let message = format!("expected {}, found {}", expected.join(" or "), describe(item.get_ref()));
            self.problem(path, offset, message);
            return None;
        }
        match item.get_ref() {
            DeValue::Table(table) => Some(toml::Value::Table(self.table(table, schema, path))),
            DeValue::Array(items) => {
                let each = schema.get("items").unwrap_or(&Schema::Bool(true));
                let mut cleaned = Vec::new();
                for (index, element) in items.iter().enumerate() {
                    let at = format!("{path}[{index}]");
                    self.parsed.keys.insert(at.clone(), element.span());
                    match self.value(element, each, &at) {
                        Some(value) => cleaned.push(value),
                        None => {
                            cleaned.extend(self.placeholder(each));
                            self.parsed.replaced.push(at);
                        }
                    }
                }
                Some(toml::Value::Array(cleaned))
            }
            DeValue::Integer(integer) => {
                let digits = integer.as_str().replace('_', "");
                let Ok(number) = i64::from_str_radix(&digits, integer.radix()) else {
                    self.problem(path, offset, format!("{integer} is out of range"));
                    return None;
                };
                let bound = |key| schema.get(key).and_then(Schema::as_i64);
                if let Some(minimum) = bound("minimum")
                    && number < minimum
                {
                    let message = match minimum {
                        0 => format!("must not be negative, got {number}"),
                        _ => format!("must be at least {minimum}, got {number}"),
                    };
                    self.problem(path, offset, message);
                    return None;
                }
                if let Some(maximum) = bound("maximum")
                    && number > maximum
                {
                    self.problem(path, offset, format!("must be at most {maximum}, got {number}"));
                    return None;
                }
                Some(toml::Value::Integer(number))
            }
            DeValue::Float(float) => match float.as_str().replace('_', "").parse::<f64>() {
                Ok(number) => Some(toml::Value::Float(number)),
                Err(_) => {
                    self.problem(path, offset, format!("{float} is not a number"));
                    None
                }
            },
            DeValue::String(text)
                if schema.get("format").and_then(Schema::as_str) == Some("ip")
                    && text.parse::<std::net::IpAddr>().is_err() =>
            {
                self.problem(
                    path,
                    offset,
                    format!("{text:?} is not an IP address, e.g. \"10.200.1.2\" or \"fd00::2\""),
                );
                None
            }
            DeValue::String(text) => Some(toml::Value::String(text.to_string())),
            DeValue::Boolean(value) => Some(toml::Value::Boolean(*value)),
            DeValue::Datetime(value) => Some(toml::Value::Datetime(*value)),
        }
    }

    fn choice(
        &mut self,
        item: &DeValue<'_>,
        names: &[&str],
        kind: Option<&str>,
        path: &str,
        offset: usize,
    ) -> Option<toml::Value> {
        let kind = kind.map_or_else(|| "value".to_owned(), words);
        let expected = names.join(", ");
        match item {
            DeValue::String(name) if names.contains(&name.as_ref()) => Some(toml::Value::String(name.to_string())),
            DeValue::String(name) => {
                let hint = closest(name, names.iter().copied()).map(|close| format!(" (did you mean {close:?}?)"));
                let hint = hint.unwrap_or_default();
                self.problem(path, offset, format!("unknown {kind} {name:?}; expected one of {expected}{hint}"));
                None
            }
            other => {
                self.problem(path, offset, format!("expected a {kind}: one of {expected}, found {}", describe(other)));
                None
            }
        }
    }

    fn table(&mut self, table: &DeTable<'_>, schema: &'s Schema, path: &str) -> toml::Table {
        let (schema, _) = self.resolve(schema);
        let properties = schema.get("properties").and_then(Schema::as_object);
        let additional = schema.get("additionalProperties");
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Schema::as_array)
            .map(|names| names.iter().filter_map(Schema::as_str).collect())
            .unwrap_or_default();
        let mut cleaned = toml::Table::new();
        for (key, value) in table {
            let name = key.get_ref().as_ref();
            let at = join(path, name);
            self.parsed.keys.insert(at.clone(), key.span());
            let field = properties.and_then(|properties| properties.get(name));
            let field = match (field, additional) {
                (Some(field), _) => field,
                (None, Some(Schema::Bool(false))) => {
                    let known = properties.map(|properties| properties.keys().map(String::as_str).collect::<Vec<_>>());
                    let known = known.unwrap_or_default();
                    let message = match closest(name, known.iter().copied()) {
                        Some(close) => format!("unknown key; did you mean {close:?}?"),
                        None => format!("unknown key; the keys here are {}", known.join(", ")),
                    };
                    self.problem(&at, key.span().start, message);
                    continue;
                }
                (None, Some(field)) if field.is_object() => field,
                (None, _) => &Schema::Bool(true),
            };
            match self.value(value, field, &at) {
                Some(value) => {
                    cleaned.insert(name.to_owned(), value);
                }
                None => {
                    if required.contains(&name)
                        && let Some(placeholder) = self.placeholder(field)
                    {
                        cleaned.insert(name.to_owned(), placeholder);
                    }
                    self.parsed.replaced.push(at);
                }
            }
        }
        for name in required.into_iter().filter(|name| !table.keys().any(|key| key.get_ref() == name)) {
            let offset = self.parsed.keys.get(path).map_or(0, |span| span.start);
            let describe = if path.is_empty() { "the file".to_owned() } else { path.to_owned() };
            self.problem(path, offset, format!("{name:?} is missing: {describe} needs one"));
            let field = properties.and_then(|properties| properties.get(name));
            if let Some(placeholder) = field.and_then(|field| self.placeholder(field)) {
                cleaned.insert(name.to_owned(), placeholder);
            }
            self.parsed.replaced.push(join(path, name));
        }
        cleaned
    }

    /// A value of this schema's shape, standing in for a bad one the config must have (so the rest deserializes).
    fn placeholder(&self, schema: &'s Schema) -> Option<toml::Value> {
        let (schema, _) = self.resolve(schema);
        if let Some(names) = self.choices(schema) {
            return names.first().map(|name| toml::Value::String((*name).to_owned()));
        }
        if let Some(first) = alternatives(schema).first() {
            return self.placeholder(first);
        }
        Some(match types(schema).first().copied()? {
            "object" => {
                let mut table = toml::Table::new();
                let properties = schema.get("properties");
                for name in schema.get("required").and_then(Schema::as_array).into_iter().flatten() {
                    let field = name.as_str().and_then(|name| Some((name, properties?.get(name)?)));
                    if let Some((name, value)) = field.and_then(|(name, field)| Some((name, self.placeholder(field)?)))
                    {
                        table.insert(name.to_owned(), value);
                    }
                }
                toml::Value::Table(table)
            }
            "array" => toml::Value::Array(Vec::new()),
            "integer" => toml::Value::Integer(0),
            "number" => toml::Value::Float(0.0),
            "boolean" => toml::Value::Boolean(false),
            _ if schema.get("format").and_then(Schema::as_str) == Some("ip") => toml::Value::String("0.0.0.0".into()),
            _ => toml::Value::String(String::new()),
        })
    }
}

/// The alternatives of `anyOf` / `oneOf` other than null (TOML has no null: an optional key is left out).
fn alternatives(schema: &Schema) -> Vec<&Schema> {
    let listed = ["anyOf", "oneOf"].into_iter().filter_map(|key| schema.get(key).and_then(Schema::as_array));
    listed.flatten().filter(|alternative| alternative.get("type").and_then(Schema::as_str) != Some("null")).collect()
}

/// The JSON types a schema admits, null aside; a schema with properties and no type is an object.
fn types(schema: &Schema) -> Vec<&str> {
    let named: Vec<&str> = match schema.get("type") {
        Some(Schema::String(kind)) => vec![kind.as_str()],
        Some(Schema::Array(kinds)) => kinds.iter().filter_map(Schema::as_str).collect(),
        _ if schema.get("properties").is_some() => vec!["object"],
        _ => Vec::new(),
    };
    named.into_iter().filter(|kind| *kind != "null").collect()
}

fn fits(schema: &Schema, item: &DeValue<'_>) -> bool {
    let kinds = types(schema);
    kinds.is_empty() || kinds.iter().any(|kind| matches(kind, item))
}

fn matches(kind: &str, item: &DeValue<'_>) -> bool {
    matches!(
        (kind, item),
        ("object", DeValue::Table(_))
            | ("array", DeValue::Array(_))
            | ("string", DeValue::String(_))
            | ("integer", DeValue::Integer(_))
            | ("boolean", DeValue::Boolean(_))
            | ("number", DeValue::Integer(_) | DeValue::Float(_))
    )
}

fn article(kind: &str) -> &'static str {
    match kind {
        "object" => "a table",
        "array" => "an array",
        "string" => "a string",
        "integer" => "an integer",
        "number" => "a number",
        "boolean" => "true or false",
        _ => "a value of another type",
    }
}

/// What a value of the wrong type is, for a problem. A string's text is never shown: it may be a key written in the
/// wrong place (`api_keys = "…"`), and problems reach logs.
fn describe(item: &DeValue<'_>) -> String {
    match item {
        DeValue::String(_) => "a string".to_owned(),
        DeValue::Integer(integer) => format!("the integer {integer}"),
        DeValue::Float(float) => format!("the number {float}"),
        DeValue::Boolean(value) => format!("{value}"),
        DeValue::Datetime(value) => format!("the date {value}"),
        DeValue::Array(_) => "an array".to_owned(),
        DeValue::Table(_) => "a table".to_owned(),
    }
}

/// A definition's name as words (`GvisorPlatform` → `gvisor platform`).
fn words(name: &str) -> String {
    let mut out = String::new();
    for (index, c) in name.chars().enumerate() {
        if c.is_uppercase() && index > 0 {
            out.push(' ');
        }
        out.extend(c.to_lowercase());
    }
    out
}

/// The candidate closest to `wrong`, if it is close enough to be a typo.
fn closest<'c>(wrong: &str, candidates: impl Iterator<Item = &'c str>) -> Option<&'c str> {
    let distance = |candidate: &&str| strsim::damerau_levenshtein(wrong, candidate);
    let best = candidates.min_by_key(distance)?;
    (distance(&best) <= (wrong.chars().count() / 3).clamp(1, 3)).then_some(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<String> {
        let parsed = Parsed::new(text);
        let (config, mut problems) = parsed.tolerant();
        problems.extend(parsed.place(config.problems()));
        sort(&mut problems);
        problems.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn every_structural_problem_is_reported_at_its_path_line_and_column() {
        let text = "lisen = \"127.0.0.1:1\"\nmax_timeout_s = \"long\"\n[[pools]]\nisolation = \"gvisr\"\n\
                    [[tenants]]\nname = \"a\"\napi_keys = [\"0123456789abcdef-1\", 7]\n";
        assert_eq!(
            problems(text),
            [
                "1:1: lisen: unknown key; did you mean \"listen\"?",
                "2:17: max_timeout_s: expected an integer, found a string",
                "4:13: pools[0].isolation: unknown tier \"gvisr\"; expected one of process, gvisor, microvm, auto \
                 (did you mean \"gvisor\"?)",
                "7:35: tenants[0].api_keys[1]: expected a string, found the integer 7",
            ]
        );
    }

    #[test]
    fn semantic_problems_are_placed_at_their_keys_and_none_follow_from_a_reported_value() {
        let key = "0123456789abcdef-key";
        let text = format!(
            "[[tenants]]\nname = \"a\"\napi_keys = [\"{key}\"]\n[[tenants]]\nname = \"b\"\napi_keys = [\"{key}\"]\n\
             [[pools]]\nmin = 9\nmax = 2\n[[pools]]\nmin = \"x\"\n[egress]\nallow_cidrs = [\"nope\"]\n"
        );
        assert_eq!(
            problems(&text),
            [
                "6:13: tenants[1].api_keys[0]: this API key (not shown) is configured more than once: also at \
                 tenants[0].api_keys[0]"
                    .to_owned(),
                "8:1: pools[0].min: must be 1 to max (2), got 9".to_owned(),
                "11:7: pools[1].min: expected an integer, found a string".to_owned(),
                "13:16: egress.allow_cidrs[0]: invalid CIDR \"nope\": write an address with a prefix length, e.g. \
                 \"10.200.1.0/24\""
                    .to_owned(),
            ]
        );
        assert!(!problems(&text).concat().contains(key));
    }

    #[test]
    fn syntax_errors_are_reported_and_nothing_else() {
        let found = problems("listen = \n[tenants\n");
        assert!(!found.is_empty() && found.iter().all(|p| p.contains("invalid TOML")), "{found:?}");
    }

    #[test]
    fn missing_required_keys_are_named() {
        let found = problems("insecure_no_auth = true\n[[tenants]]\nmax_sandboxes = 1\n");
        assert_eq!(found, ["2:1: tenants[0]: \"name\" is missing: tenants[0] needs one"], "{found:?}");
    }

    #[test]
    fn numbers_out_of_the_types_range_and_floats_for_integers_are_named() {
        let found = problems("insecure_no_auth = true\nmax_pids = -1\n[http]\nmax_connections = 1.5\n");
        assert_eq!(
            found,
            [
                "2:12: max_pids: must not be negative, got -1",
                "4:19: http.max_connections: expected an integer, found the number 1.5",
            ]
        );
    }

    #[test]
    fn a_bad_address_of_a_static_host_is_named() {
        let found = problems("insecure_no_auth = true\n[egress.hosts]\n\"a.test\" = [\"10.0.0.1\", \"10.0.0.300\"]\n");
        let expected =
            "3:25: egress.hosts.\"a.test\"[1]: \"10.0.0.300\" is not an IP address, e.g. \"10.200.1.2\" or \"fd00::2\"";
        assert_eq!(found, [expected]);
    }

    #[test]
    fn a_key_written_where_a_list_belongs_is_not_shown() {
        let found = problems("[[tenants]]\nname = \"a\"\napi_keys = \"0123456789abcdef-secret\"\n");
        assert_eq!(found, ["3:12: tenants[0].api_keys: expected an array, found a string"]);
    }

    #[test]
    fn parents_climb_quoted_keys_and_indices() {
        assert_eq!(parent("egress.hosts.\"a.b\""), Some("egress.hosts"));
        assert_eq!(parent("pools[0].limits"), Some("pools[0]"));
        assert_eq!(parent("pools[0]"), Some("pools"));
        assert_eq!(parent("pools"), Some(""));
        assert_eq!(parent(""), None);
    }
}

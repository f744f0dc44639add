//! `berthd config reference`: every option of the configuration file with its type, default and
//! meaning, generated from the JSON schema of the structs the parser itself uses.

use serde_json::{Map, Value};

use super::{Config, DEFAULT_CONFIG_PATH};

/// The reference as text: one entry per key, tables after the keys of their parent.
pub fn reference() -> String {
    let schema = schemars::schema_for!(Config);
    let root = schema.as_value();
    let empty = Map::new();
    let defs = root
        .get("$defs")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut out = format!(
        "Berth configuration reference: {DEFAULT_CONFIG_PATH} (TOML; every key is optional).\n\
         Drop-in files (<config dir>/*.toml) override it key by key; command-line flags override both.\n\
         An unknown key is an error.\n"
    );
    table(root, defs, "", &mut out);
    out
}

/// berth.toml(5): the reference as a manual page (roff).
pub fn man_page() -> String {
    let mut out = String::from(
        ".TH BERTH.TOML 5 \"\" \"berth\" \"File Formats\"\n\
         .SH NAME\nberth.toml \\- configuration file of berthd(8)\n\
         .SH SYNOPSIS\n/etc/berth/config.toml, /etc/berth/config.d/*.toml\n\
         .SH DESCRIPTION\n",
    );
    out.push_str(".nf\n");
    for line in reference().lines() {
        // Backslashes are roff escapes; a line starting with '.' or '\'' would be a request.
        let line = line.replace('\\', "\\e");
        if line.starts_with('.') || line.starts_with('\'') {
            out.push_str("\\&");
        }
        out.push_str(&line);
        out.push('\n');
    }
    out.push_str(".fi\n.SH SEE ALSO\nberthd(8), berthctl(1)\n");
    out
}

/// The keys of the table `schema` at `prefix`, then its sub-tables.
fn table(schema: &Value, defs: &Map<String, Value>, prefix: &str, out: &mut String) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    let mut tables = Vec::new();
    for (name, prop) in props {
        let key = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let target = resolve(prop, defs);
        if target.get("properties").is_some() {
            tables.push((key, prop, target));
            continue;
        }
        out.push_str(&format!(
            "\n{key}\n    type: {}\n    default: {}\n",
            type_name(prop, defs),
            default_text(prop.get("default"))
        ));
        for line in description(prop, target).lines() {
            out.push_str(&format!("    {line}\n"));
        }
    }
    for (key, prop, target) in tables {
        out.push_str(&format!("\n[{key}]\n"));
        for line in description(prop, target).lines() {
            out.push_str(&format!("{line}\n"));
        }
        table(target, defs, &key, out);
    }
}

/// The schema `prop` stands for, through a `$ref` (alone or in an `allOf`).
fn resolve<'a>(prop: &'a Value, defs: &'a Map<String, Value>) -> &'a Value {
    let reference = prop.get("$ref").or_else(|| {
        prop.get("allOf")
            .and_then(Value::as_array)
            .and_then(|all| all.iter().find_map(|v| v.get("$ref")))
    });
    reference
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
        .and_then(|name| defs.get(name))
        .unwrap_or(prop)
}

/// The field's own description, else its type's.
fn description<'a>(prop: &'a Value, target: &'a Value) -> &'a str {
    prop.get("description")
        .or_else(|| target.get("description"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The TOML type of `prop`: string, integer, float, boolean, an array or a table of them, or
/// a table of fields; "(optional)" where it may be left unset.
fn type_name(prop: &Value, defs: &Map<String, Value>) -> String {
    let target = resolve(prop, defs);
    let types: Vec<&str> = match target.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let optional = types.contains(&"null");
    let main = types.iter().find(|t| **t != "null").copied().unwrap_or("");
    let name = match main {
        "string" => "string".to_string(),
        "integer" => "integer".to_string(),
        "number" => "float".to_string(),
        "boolean" => "boolean".to_string(),
        "array" => match target.get("items") {
            Some(items) => format!("array of {}", type_name(items, defs)),
            None => "array".to_string(),
        },
        "object" => match target.get("additionalProperties") {
            Some(v @ Value::Object(_)) => format!("table of {}", type_name(v, defs)),
            _ => "table".to_string(),
        },
        _ => "value".to_string(),
    };
    if optional {
        format!("{name} (optional)")
    } else {
        name
    }
}

/// A default as it is written in TOML; "unset" for none.
fn default_text(default: Option<&Value>) -> String {
    match default {
        None | Some(Value::Null) => "unset".to_string(),
        Some(Value::String(s)) => format!("{s:?}"),
        Some(Value::Array(items)) => format!(
            "[{}]",
            items
                .iter()
                .map(|v| default_text(Some(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Some(Value::Object(map)) if map.is_empty() => "{}".to_string(),
        Some(Value::Object(map)) => format!(
            "{{ {} }}",
            map.iter()
                .map(|(k, v)| format!("{} = {}", toml_key(k), default_text(Some(v))))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Some(v) => v.to_string(),
    }
}

/// A key as TOML writes it: bare when it can be, quoted otherwise.
fn toml_key(k: &str) -> String {
    if !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        k.to_string()
    } else {
        format!("{k:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key of the default file appears in the reference, sections as sections.
    #[test]
    fn every_key_of_the_parser_is_in_the_reference() {
        let text = reference();
        let defaults = toml::Value::try_from(Config::default()).expect("defaults");
        let mut keys = 0;
        check(&text, &defaults, "", &mut keys);
        assert!(keys > 40, "{keys} keys");
        // Optional keys the default file leaves out are there too.
        for entry in [
            "\nagent.kubeconfig\n    type: string (optional)\n    default: unset\n",
            "\nroot\n    type: string\n    default: \"/var/lib/berth\"\n",
            "\ncni.plugin_timeout_secs\n    type: float\n    default: 30.0\n",
            "\nregistry.mirrors\n    type: table of array of string\n",
        ] {
            assert!(text.contains(entry), "{entry:?} not in:\n{text}");
        }
    }

    /// Each key of table `v` is an entry of `text`, or a section whose keys are.
    fn check(text: &str, v: &toml::Value, prefix: &str, keys: &mut usize) {
        let Some(t) = v.as_table() else { return };
        for (k, v) in t {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            *keys += 1;
            if text.contains(&format!("\n[{key}]\n")) {
                check(text, v, &key, keys);
            } else {
                assert!(
                    text.contains(&format!("\n{key}\n    type: ")),
                    "{key} missing from the reference"
                );
            }
        }
    }
}

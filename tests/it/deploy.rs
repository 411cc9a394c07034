//! The deployment files checked against the code they deploy (issue #6):
//! the Kubernetes manifests load, their configuration loads with the
//! sidecar's own loader and CLI, ports, probes, grace period and security
//! settings agree with the code's defaults, the alerts and the dashboard use
//! only metrics a running sidecar exports, and the Debezium connectors
//! produce what the decoder reads.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use entity::Status;
use outbox_sidecar::cdc::{Decision, Decoder, Record};
use outbox_sidecar::cli::{Cli, Command};
use outbox_sidecar::config::{AdminSettings, Settings, ShutdownSettings};
use serde::Deserialize;
use serde_json::json;
use serde_yaml::Value;

use crate::harness::{eventually, spawn_app, Options};

const SIDECAR: &str = "outbox-sidecar";
const KUBERNETES: &str = "deploy/kubernetes";

// ---------------------------------------------------------------- reading

fn path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(path(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// The files of `dir` (relative to the repository) ending in one of `exts`.
fn files(dir: &str, exts: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(path(dir)).unwrap_or_else(|e| panic!("list {dir}: {e}"));
    for entry in entries {
        let entry = entry.expect("dir entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = format!("{dir}/{name}");
        if entry.file_type().expect("file type").is_dir() {
            out.extend(files(&rel, exts));
        } else if exts.iter().any(|ext| name.ends_with(&format!(".{ext}"))) {
            out.push(rel);
        }
    }
    out.sort();
    out
}

/// Every YAML document of a file; empty documents (a trailing `---`) dropped.
fn yaml_docs(rel: &str) -> Vec<Value> {
    let text = read(rel);
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}")))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The one manifest of `kind` among the Kubernetes files.
fn manifest(kind: &str) -> Value {
    let mut found: Vec<Value> = files(KUBERNETES, &["yaml", "yml"])
        .iter()
        .flat_map(|f| yaml_docs(f))
        .filter(|doc| doc["kind"].as_str() == Some(kind))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected exactly one {kind} in {KUBERNETES}"
    );
    found.remove(0)
}

fn json_file(rel: &str) -> serde_json::Value {
    serde_json::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not JSON: {e}"))
}

fn str_of<'v>(v: &'v Value, what: &str) -> &'v str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v:?}"))
}

fn seq(v: &Value) -> &[Value] {
    v.as_sequence().map(Vec::as_slice).unwrap_or_default()
}

/// The container named `name` in a pod spec, init (native sidecar) or not.
fn container<'v>(pod: &'v Value, name: &str) -> &'v Value {
    seq(&pod["initContainers"])
        .iter()
        .chain(seq(&pod["containers"]))
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no container {name} in {pod:?}"))
}

fn deployment_pod() -> Value {
    manifest("Deployment")["spec"]["template"]["spec"].clone()
}

fn job_pod() -> Value {
    manifest("Job")["spec"]["template"]["spec"].clone()
}

fn prune_pod() -> Value {
    manifest("CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"].clone()
}

/// The only container of the migration Job.
fn job_container(pod: &Value) -> &Value {
    let containers = seq(&pod["containers"]);
    assert_eq!(containers.len(), 1, "the migration Job has one container");
    &containers[0]
}

fn argv(c: &Value) -> Vec<String> {
    seq(&c["command"])
        .iter()
        .chain(seq(&c["args"]))
        .map(|a| str_of(a, "a command argument").to_owned())
        .collect()
}

/// A placeholder of the right form for the secret named `name`.
fn placeholder_secret(name: &str) -> String {
    if name.to_ascii_lowercase().contains("url") {
        "postgres://outbox:placeholder@db.example:5432/app".to_owned()
    } else {
        // Long enough for admin.token's minimum.
        "placeholder-for-a-secret-0123456789".to_owned()
    }
}

/// Whether a variable names a file the sidecar reads a secret from.
fn is_file_variable(name: &str) -> bool {
    name.ends_with("_FILE") || name.contains("__HEADER_FILES__")
}

/// The (Secret name, key) whose file `path` is in container `c` of `pod`:
/// a `secret` volume mounted at a prefix of `path`.
fn mounted_secret_key(pod: &Value, c: &Value, path: &str) -> Option<(String, String)> {
    seq(&c["volumeMounts"]).iter().find_map(|m| {
        let mount = str_of(&m["mountPath"], "mountPath");
        let rest = Path::new(path)
            .strip_prefix(mount)
            .ok()?
            .to_str()?
            .to_owned();
        let volume = seq(&pod["volumes"])
            .iter()
            .find(|v| v["name"] == m["name"] && v["secret"].is_mapping())?;
        let secret = str_of(&volume["secret"]["secretName"], "secretName").to_owned();
        let key = match volume["secret"]["items"].as_sequence() {
            Some(items) => items
                .iter()
                .find(|i| i["path"].as_str() == Some(rest.as_str()))
                .map(|i| str_of(&i["key"], "items[].key").to_owned())?,
            None => rest,
        };
        Some((secret, key))
    })
}

/// The `OUTBOX__…` variables a container of `pod` gets. Those from a Secret
/// get a placeholder of the right form; a `…_FILE` variable naming a file
/// of a mounted Secret gets a file holding such a placeholder, so the
/// sidecar's loader reads it as it would in the pod.
fn outbox_env(pod: &Value, c: &Value) -> BTreeMap<String, String> {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "outbox-deploy-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("a directory for the Secret's files");
    seq(&c["env"])
        .iter()
        .filter_map(|e| {
            let name = str_of(&e["name"], "env name");
            if !name.starts_with("OUTBOX__") {
                return None;
            }
            let value = match e["value"].as_str() {
                Some(path) if is_file_variable(name) => {
                    let (_, key) = mounted_secret_key(pod, c, path).unwrap_or_else(|| {
                        panic!("{name}={path} is not a file of a mounted Secret")
                    });
                    let file = dir.join(&key);
                    std::fs::write(&file, placeholder_secret(&key)).expect("write a secret file");
                    file.display().to_string()
                }
                Some(v) => v.to_owned(),
                None => placeholder_secret(name),
            };
            Some((name.to_owned(), value))
        })
        .collect()
}

fn configmap_toml() -> String {
    let cm = manifest("ConfigMap");
    str_of(&cm["data"]["config.toml"], "the ConfigMap's config.toml").to_owned()
}

/// The sidecar's effective settings in the Deployment: the ConfigMap's TOML
/// and the container's environment, through the sidecar's own loader.
fn deployed_settings() -> Settings {
    let pod = deployment_pod();
    let env = outbox_env(&pod, container(&pod, SIDECAR));
    Settings::from_toml(Some(&configmap_toml()), env)
        .unwrap_or_else(|e| panic!("the ConfigMap with the Deployment's env: {e}"))
}

fn port_of(listen: &str) -> u16 {
    listen
        .parse::<SocketAddr>()
        .unwrap_or_else(|e| panic!("{listen:?}: {e}"))
        .port()
}

fn default_admin_port() -> u16 {
    port_of(&AdminSettings::default().listen)
}

/// A container port given by name or number, as a number.
fn resolve_port(c: &Value, port: &Value) -> u16 {
    if let Some(n) = port.as_u64() {
        return u16::try_from(n).expect("port number");
    }
    let name = str_of(port, "a port");
    let found = seq(&c["ports"])
        .iter()
        .find(|p| p["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no container port named {name}"));
    u16::try_from(found["containerPort"].as_u64().expect("containerPort")).expect("port number")
}

/// `labels` holds every pair of `selector`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let selector = selector.as_mapping().expect("a selector mapping");
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Metric names in a PromQL expression: `outbox_…` identifiers.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let bytes = expr.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut names = BTreeSet::new();
    let mut i = 0;
    while let Some(at) = expr[i..].find("outbox_").map(|at| i + at) {
        let end = expr[at..]
            .bytes()
            .position(|b| !ident(b))
            .map_or(expr.len(), |n| at + n);
        if at == 0 || !ident(bytes[at - 1]) {
            names.insert(expr[at..end].to_owned());
        }
        i = end;
    }
    names
}

fn rule_exprs() -> Vec<String> {
    let rule = manifest("PrometheusRule");
    seq(&rule["spec"]["groups"])
        .iter()
        .flat_map(|g| seq(&g["rules"]))
        .map(|r| str_of(&r["expr"], "a rule's expr").to_owned())
        .collect()
}

/// The PromQL of the dashboard: panel targets and templating queries.
fn dashboard_exprs() -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr" | "query" | "definition", serde_json::Value::String(s)) => {
                            out.push(s.clone())
                        }
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&json_file("deploy/grafana/outbox-sidecar.json"), &mut out);
    assert!(!out.is_empty(), "the dashboard has no queries");
    out
}

// ---------------------------------------------------------------- files

#[test]
fn every_manifest_connector_and_dashboard_parses() {
    let yaml = files("deploy", &["yaml", "yml"]);
    assert!(
        yaml.len() >= 8,
        "expected the Kubernetes manifests, found {yaml:?}"
    );
    for f in &yaml {
        let docs = yaml_docs(f);
        assert!(!docs.is_empty(), "{f} holds no document");
        for doc in &docs {
            assert!(
                doc["apiVersion"].is_string() && doc["kind"].is_string(),
                "{f}: a document without apiVersion/kind"
            );
        }
    }
    let json = files("deploy", &["json"]);
    assert!(
        json.len() >= 3,
        "expected the connectors and the dashboard, found {json:?}"
    );
    for f in &json {
        json_file(f);
    }
}

#[test]
fn kustomization_lists_every_resource_file_and_only_existing_ones() {
    let rel = format!("{KUBERNETES}/kustomization.yaml");
    let k = yaml_docs(&rel).remove(0);
    let listed: BTreeSet<String> = seq(&k["resources"])
        .iter()
        .map(|r| str_of(r, "a resource").to_owned())
        .collect();
    for r in &listed {
        assert!(
            path(&format!("{KUBERNETES}/{r}")).is_file(),
            "{rel} lists {r}, which does not exist"
        );
    }
    // A file left out must be named in a comment saying why.
    let comments: String = read(&rel)
        .lines()
        .filter(|l| l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    for f in files(KUBERNETES, &["yaml", "yml"]) {
        let name = f.rsplit('/').next().expect("file name");
        if name == "kustomization.yaml" || listed.contains(name) {
            continue;
        }
        assert!(
            comments.contains(name),
            "{f} is neither a resource of {rel} nor excluded in a comment there"
        );
    }
    // `images:` only retags what names the same image.
    let sidecar_image = str_of(&container(&deployment_pod(), SIDECAR)["image"], "image").to_owned();
    let job_image = str_of(&job_container(&job_pod())["image"], "image").to_owned();
    for image in seq(&k["images"]) {
        let name = str_of(&image["name"], "images[].name");
        for used in [&sidecar_image, &job_image] {
            assert_eq!(
                used.rsplit_once(':')
                    .map_or(used.as_str(), |(repo, _)| repo),
                name,
                "{rel} images: {name} does not name {used}"
            );
        }
    }
}

// ---------------------------------------------------------------- configuration

#[test]
fn configmap_loads_with_the_deployments_environment_and_the_sidecars_loader() {
    let settings = deployed_settings();
    settings
        .validate_for_run()
        .unwrap_or_else(|e| panic!("`outbox-sidecar run` would refuse the ConfigMap: {e}"));
    assert_eq!(settings.database.table, entity::DEFAULT_TABLE);
    assert!(
        !settings.dispatchers.is_empty(),
        "the ConfigMap configures no dispatcher"
    );
    assert!(
        settings.admin.token.is_some(),
        "the Deployment gives no admin token: the admin API would be disabled"
    );

    // The TOML alone does not carry the database URL: it is a secret.
    assert!(Settings::from_toml(Some(&configmap_toml()), BTreeMap::new()).is_err());
}

/// Issue #17: a rollout moves only the partitions that change owner
/// (cooperative-sticky), and a restarted container takes its own back
/// (static membership from the pod name).
#[test]
fn the_shipped_group_rebalances_cooperatively_with_static_members() {
    let settings = deployed_settings();
    let property = |name: &str| {
        settings
            .kafka
            .properties
            .iter()
            .find(|(k, _)| outbox_sidecar::config::property_name(k) == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        property("partition.assignment.strategy").as_deref(),
        Some("cooperative-sticky")
    );
    assert!(
        property("group.instance.id").is_some(),
        "the Deployment sets no group.instance.id"
    );
}

/// The CronJob's commented alternative prunes old sent events (with the
/// attempt log by age): off as shipped, a command the CLI takes.
#[test]
fn the_prune_of_old_sent_events_is_shipped_commented() {
    let text = read("deploy/kubernetes/prune-cronjob.yaml");
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("# args:") && l.contains("--sent-older-than"))
        .expect("a commented args line with --sent-older-than");
    let args: Value = serde_yaml::from_str(line.trim_start_matches("# args:")).unwrap();
    let argv: Vec<String> = std::iter::once(SIDECAR.to_owned())
        .chain(
            seq(&args)
                .iter()
                .map(|a| str_of(a, "an argument").to_owned()),
        )
        .collect();
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    match &cli.command {
        Command::Events(outbox_sidecar::cli::EventsCommand::Prune {
            sent_older_than: Some(age),
            older_than: Some(_),
            dry_run: false,
            ..
        }) => assert_eq!(age, "30d"),
        other => panic!("{argv:?} runs {other:?}"),
    }
    // As shipped, the active args prune the attempt log only.
    let prune = prune_pod();
    assert!(!argv_of_prune(&prune)
        .iter()
        .any(|a| a == "--sent-older-than"));
}

fn argv_of_prune(pod: &Value) -> Vec<String> {
    argv(job_container(pod))
}

#[test]
fn pods_run_the_cli_commands_with_the_configmap_as_their_file() {
    let pod = deployment_pod();
    let job = job_pod();
    let prune = prune_pod();
    for (pod, c, want) in [
        (&pod, container(&pod, SIDECAR), "run"),
        (&job, job_container(&job), "migrate"),
        (&prune, job_container(&prune), "prune"),
    ] {
        let argv = argv(c);
        assert_eq!(argv.first().map(String::as_str), Some(SIDECAR), "{argv:?}");
        let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        match (&cli.command, want) {
            (Command::Run, "run") | (Command::Migrate, "migrate") => {}
            (
                Command::Events(outbox_sidecar::cli::EventsCommand::Prune {
                    older_than: None, ..
                }),
                "prune",
            ) => {}
            (other, _) => panic!("{argv:?} runs {other:?}, expected `{SIDECAR} {want}`"),
        }
        let file = cli.config.expect("--config");
        assert_configmap_mounted_at(pod, c, &file);
        if let Some(e) = seq(&c["env"])
            .iter()
            .find(|e| e["name"].as_str() == Some("OUTBOX_CONFIG"))
        {
            assert_eq!(Path::new(str_of(&e["value"], "OUTBOX_CONFIG")), file);
        }
        Settings::from_toml(Some(&configmap_toml()), outbox_env(pod, c))
            .unwrap_or_else(|e| panic!("`{}` would refuse its configuration: {e}", argv.join(" ")));
    }

    // The image's default command is the same main job.
    let dockerfile = read("Dockerfile");
    let instruction = |name: &str| -> Vec<String> {
        let line = dockerfile
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("Dockerfile has no {name}"));
        serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("Dockerfile {name} is not exec form: {e}"))
    };
    let argv = [instruction("ENTRYPOINT"), instruction("CMD")].concat();
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("Dockerfile {argv:?}: {e}"));
    assert!(
        matches!(cli.command, Command::Run),
        "the image runs {argv:?}"
    );
}

/// `file` is the ConfigMap's `config.toml`, mounted into `c`.
fn assert_configmap_mounted_at(pod: &Value, c: &Value, file: &Path) {
    let cm_name = manifest("ConfigMap")["metadata"]["name"].clone();
    let found = seq(&c["volumeMounts"]).iter().any(|m| {
        let Ok(rest) = file.strip_prefix(str_of(&m["mountPath"], "mountPath")) else {
            return false;
        };
        seq(&pod["volumes"]).iter().any(|v| {
            v["name"] == m["name"]
                && v["configMap"]["name"] == cm_name
                && match v["configMap"]["items"].as_sequence() {
                    Some(items) => items.iter().any(|i| {
                        i["key"].as_str() == Some("config.toml")
                            && Path::new(str_of(&i["path"], "items[].path")) == rest
                    }),
                    None => rest == Path::new("config.toml"),
                }
        })
    });
    assert!(
        found,
        "{} is not the ConfigMap's config.toml in container {:?}",
        file.display(),
        c["name"]
    );
}

// ---------------------------------------------------------------- ports, probes, shutdown

#[test]
fn ports_probes_service_and_servicemonitor_match_the_admin_defaults() {
    let default_port = default_admin_port();
    assert_eq!(
        port_of(&deployed_settings().admin.listen),
        default_port,
        "the ConfigMap moves admin.listen off the default"
    );

    let pod = deployment_pod();
    let c = container(&pod, SIDECAR);
    let get = &c["livenessProbe"]["httpGet"];
    assert_eq!(
        resolve_port(c, &get["port"]),
        default_port,
        "livenessProbe port"
    );

    let labels = &manifest("Deployment")["spec"]["template"]["metadata"]["labels"];
    let service = manifest("Service");
    assert!(
        selects(&service["spec"]["selector"], labels),
        "the Service selects no pod of the Deployment"
    );
    let ports = seq(&service["spec"]["ports"]);
    assert_eq!(ports.len(), 1);
    // Issue 17 item 4: the admin API stays inside the pod by default.
    let api = deployed_settings()
        .admin_api_listen()
        .expect("admin.api_listen");
    assert!(
        api.ip().is_loopback(),
        "the ConfigMap exposes the admin API on {api}"
    );
    assert_ne!(api.port(), default_port);
    assert!(
        !seq(&c["ports"])
            .iter()
            .any(|p| p["containerPort"].as_u64() == Some(u64::from(api.port()))),
        "the sidecar container declares the admin API's port"
    );
    let sport = &ports[0];
    assert_eq!(
        resolve_port(c, &sport["targetPort"]),
        default_port,
        "Service targetPort"
    );
    assert_eq!(
        sport["port"].as_u64(),
        Some(u64::from(default_port)),
        "Service port"
    );

    let monitor = manifest("ServiceMonitor");
    assert!(
        selects(
            &monitor["spec"]["selector"]["matchLabels"],
            &service["metadata"]["labels"]
        ),
        "the ServiceMonitor does not select the Service"
    );
    let endpoints = seq(&monitor["spec"]["endpoints"]);
    assert_eq!(endpoints.len(), 1);
    assert_eq!(
        endpoints[0]["port"], sport["name"],
        "ServiceMonitor endpoint port"
    );

    // The alerts' `job` label is the one the ServiceMonitor gives the targets.
    let job_label = str_of(&monitor["spec"]["jobLabel"], "jobLabel");
    let job = str_of(
        &service["metadata"]["labels"][job_label],
        "the Service's job label",
    );
    for expr in rule_exprs().iter().chain(&dashboard_exprs()) {
        if let Some(rest) = expr.split("job=\"").nth(1) {
            assert_eq!(rest.split('"').next(), Some(job), "{expr}");
        }
    }

    // The image documents the same port.
    assert!(
        read("Dockerfile")
            .lines()
            .any(|l| l.trim() == format!("EXPOSE {default_port}")),
        "Dockerfile EXPOSE"
    );
}

/// Issue 17 item 1: a native sidecar's readiness counts toward the pod's,
/// so the shipped default must not let a Kafka outage or a slow group join
/// take the application out of its Service. Liveness stays (a wedged
/// sidecar is restarted); the sidecar's own readiness is a metric and an alert.
#[test]
fn the_shipped_sidecar_does_not_gate_the_pods_readiness() {
    let pod = deployment_pod();
    let c = container(&pod, SIDECAR);
    for probe in ["readinessProbe", "startupProbe"] {
        assert!(
            c[probe].is_null(),
            "the sidecar has a {probe}: Kafka or the database would decide whether the \
             application's pods receive traffic"
        );
    }
    assert_eq!(
        c["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/livez"),
        "liveness (which depends on neither Kafka nor the database) stays"
    );
    let rule = manifest("PrometheusRule");
    let alert = seq(&rule["spec"]["groups"])
        .iter()
        .flat_map(|g| seq(&g["rules"]))
        .find(|r| metric_names(str_of(&r["expr"], "expr")).contains("outbox_ready"))
        .expect("an alert on outbox_ready stands in for the readiness probe");
    assert!(
        alert["for"].is_string(),
        "the readiness alert needs a `for:` so a rollout's group join does not page"
    );
    // The coupled variant stays available, documented.
    let readme = read("deploy/README.md");
    assert!(
        readme.contains("readinessProbe:") && readme.contains("path: /readyz"),
        "deploy/README.md documents the coupled readinessProbe as an option"
    );
}

#[test]
fn grace_period_outlasts_the_drain_timeout() {
    let pod = deployment_pod();
    // Kubernetes' default when the field is absent.
    let grace = Duration::from_secs(pod["terminationGracePeriodSeconds"].as_u64().unwrap_or(30));
    for drain in [
        deployed_settings().shutdown.drain_timeout,
        ShutdownSettings::default().drain_timeout,
    ] {
        assert!(
            grace > drain,
            "terminationGracePeriodSeconds {grace:?} must exceed shutdown.drain_timeout {drain:?}"
        );
    }
}

#[test]
fn sidecar_and_migration_run_unprivileged() {
    let dockerfile = read("Dockerfile");
    let image_user = dockerfile
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("Dockerfile USER");
    let image_uid: u64 = image_user
        .split(':')
        .next()
        .and_then(|u| u.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!("USER {image_user} is not numeric: runAsNonRoot cannot check a name")
        });
    assert_ne!(image_uid, 0, "the image runs as root");

    let deployment = deployment_pod();
    let job = job_pod();
    for (pod, c) in [
        (&deployment, container(&deployment, SIDECAR)),
        (&job, job_container(&job)),
    ] {
        let name = &c["name"];
        let sc = &c["securityContext"];
        let non_root = sc["runAsNonRoot"]
            .as_bool()
            .or(pod["securityContext"]["runAsNonRoot"].as_bool());
        assert_eq!(non_root, Some(true), "{name:?}: runAsNonRoot");
        if let Some(uid) = sc["runAsUser"]
            .as_u64()
            .or(pod["securityContext"]["runAsUser"].as_u64())
        {
            assert_ne!(uid, 0, "{name:?}: runAsUser");
        }
        assert_eq!(
            sc["readOnlyRootFilesystem"].as_bool(),
            Some(true),
            "{name:?}: readOnlyRootFilesystem"
        );
        assert_eq!(
            sc["allowPrivilegeEscalation"].as_bool(),
            Some(false),
            "{name:?}: allowPrivilegeEscalation"
        );
        assert!(
            seq(&sc["capabilities"]["drop"])
                .iter()
                .any(|c| c.as_str() == Some("ALL")),
            "{name:?}: capabilities.drop ALL"
        );
        assert!(
            seq(&sc["capabilities"]["add"]).is_empty(),
            "{name:?}: capabilities.add"
        );
    }
}

#[test]
fn secret_example_has_every_key_the_pods_reference() {
    let secret = manifest("Secret");
    let name = &secret["metadata"]["name"];
    let keys = secret["stringData"]
        .as_mapping()
        .expect("the example's stringData");
    let deployment = deployment_pod();
    let job = job_pod();
    for c in [container(&deployment, SIDECAR), job_container(&job)] {
        for e in seq(&c["env"]) {
            let r = &e["valueFrom"]["secretKeyRef"];
            if r.is_null() {
                continue;
            }
            assert_eq!(&r["name"], name, "{:?} reads another Secret", e["name"]);
            assert!(
                keys.contains_key(&r["key"]),
                "the Secret example lacks {:?}",
                r["key"]
            );
        }
    }
    for pod in [&deployment, &job] {
        for v in seq(&pod["volumes"]) {
            let Some(items) = v["secret"]["items"].as_sequence() else {
                continue;
            };
            assert_eq!(&v["secret"]["secretName"], name, "{:?}", v["name"]);
            for i in items {
                assert!(
                    keys.contains_key(&i["key"]),
                    "the Secret example lacks {:?}",
                    i["key"]
                );
            }
        }
    }
}

/// Issue 16 item 11: the pods read their secrets from the files of the
/// mounted Secret (`*_file` settings), not from variables; the migration
/// Job gets only the database URL.
#[test]
fn secrets_reach_the_pods_as_files_of_the_mounted_secret() {
    let secret_name = str_of(&manifest("Secret")["metadata"]["name"], "name").to_owned();
    let deployment = deployment_pod();
    let job = job_pod();
    for (pod, c, want) in [
        (
            &deployment,
            container(&deployment, SIDECAR),
            &["database-url", "admin-token", "accounts-authorization"][..],
        ),
        (&job, job_container(&job), &["database-url"][..]),
    ] {
        let mut keys = Vec::new();
        for e in seq(&c["env"]) {
            let name = str_of(&e["name"], "env name");
            assert!(
                e["valueFrom"]["secretKeyRef"].is_null(),
                "{name} takes a secret as a variable; mount it and name the file with a *_FILE setting"
            );
            if is_file_variable(name) {
                let path = str_of(&e["value"], "a *_FILE variable's value");
                let (secret, key) = mounted_secret_key(pod, c, path)
                    .unwrap_or_else(|| panic!("{name}={path} is not a file of a mounted Secret"));
                assert_eq!(secret, secret_name, "{name}");
                keys.push(key);
            }
        }
        keys.sort();
        let mut want = want.to_vec();
        want.sort();
        assert_eq!(keys, want, "the secrets container {:?} reads", c["name"]);
    }
    // What they carry reaches the settings.
    let settings = deployed_settings();
    assert!(settings.database.url.is_some());
    assert!(settings.admin.token.is_some());
    assert!(settings.dispatchers["accounts"]
        .headers
        .keys()
        .any(|h| h.eq_ignore_ascii_case("authorization")));
}

#[test]
fn the_secret_examples_admin_token_placeholder_is_refused() {
    let secret = manifest("Secret");
    let placeholder = str_of(&secret["stringData"]["admin-token"], "admin-token");
    let pod = deployment_pod();
    let env = outbox_env(&pod, container(&pod, SIDECAR));
    for (name, value) in &env {
        if name.starts_with("OUTBOX__ADMIN__TOKEN") {
            std::fs::write(value.as_str(), placeholder).expect("the admin-token file");
        }
    }
    let e = Settings::from_toml(Some(&configmap_toml()), env)
        .expect_err("the example Secret's admin-token is accepted")
        .to_string();
    assert!(e.contains("admin.token"), "{e}");
}

// ---------------------------------------------------------------- Debezium

#[test]
fn debezium_connectors_produce_what_the_decoder_reads() {
    const JSON_CONVERTER: &str = "org.apache.kafka.connect.json.JsonConverter";
    let settings = deployed_settings();
    let decoder = Decoder::new(&settings.database.table);
    let connectors = files("deploy/debezium", &["json"]);
    assert!(connectors.len() >= 2, "{connectors:?}");
    for f in &connectors {
        let config = &json_file(f)["config"];
        let get = |k: &str| config[k].as_str();
        for side in ["key", "value"] {
            assert_eq!(
                get(&format!("{side}.converter")),
                Some(JSON_CONVERTER),
                "{f}: {side}.converter"
            );
        }

        let tables: Vec<&str> = get("table.include.list")
            .unwrap_or_else(|| panic!("{f}: table.include.list"))
            .split(',')
            .map(str::trim)
            .collect();
        let table = *tables
            .iter()
            .find(|t| t.rsplit('.').next() == Some(settings.database.table.as_str()))
            .unwrap_or_else(|| {
                panic!(
                    "{f}: table.include.list {tables:?} lacks {}",
                    settings.database.table
                )
            });
        if let Some(keys) = get("message.key.columns") {
            let ours = keys
                .split(';')
                .find_map(|k| k.trim().strip_prefix(&format!("{table}:")));
            // The ordered variant keys by the aggregate ([ordering] column,
            // as config/example.toml names it); every other by `id`.
            let key = if f.contains("-ordered") {
                "aggregate_key"
            } else {
                "id"
            };
            assert_eq!(
                ours.map(str::trim),
                Some(key),
                "{f}: message.key.columns must make `{key}` the key"
            );
        }
        for column in ["id", "status"] {
            let excluded = get("column.exclude.list").unwrap_or_default();
            assert!(
                !excluded
                    .split(',')
                    .any(|c| c.trim() == format!("{table}.{column}")),
                "{f}: excludes {column}"
            );
        }
        let skipped = get("skipped.operations").unwrap_or("t");
        for op in ["c", "u", "r"] {
            assert!(
                !skipped.split(',').any(|s| s.trim() == op),
                "{f}: skips `{op}` events, which wake the sidecar"
            );
        }
        for t in get("transforms")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            assert_eq!(
                get(&format!("transforms.{t}.type")),
                Some("io.debezium.transforms.ExtractNewRecordState"),
                "{f}: transform {t} changes the shape the decoder reads"
            );
        }

        // The PostgreSQL connector's topic is the one the ConfigMap consumes.
        if get("connector.class").is_some_and(|c| c.contains("Postgres")) {
            assert_eq!(
                format!("{}.{table}", get("topic.prefix").expect("topic.prefix")),
                settings.kafka.topic,
                "{f}: topic"
            );
        }

        // A pending insert in this connector's shape triggers a dispatch.
        let wrap = |side: &str, payload: serde_json::Value| {
            if get(&format!("{side}.converter.schemas.enable")) == Some("false") {
                payload
            } else {
                json!({"schema": {"type": "struct"}, "payload": payload})
            }
        };
        let (schema, name) = table.rsplit_once('.').unwrap_or(("app", table));
        let connector = if get("connector.class").is_some_and(|c| c.contains("Postgres")) {
            "postgresql"
        } else {
            "mysql"
        };
        let key = wrap("key", json!({"id": 7})).to_string();
        let value = wrap(
            "value",
            json!({
                "before": null,
                "after": {"id": 7, "event_name": "accounts.purchase_create", "payload": "{}",
                          "status": "pending", "attempts": 0, "updated_at": 1_700_000_000_000_000_i64},
                "source": {"connector": connector, "db": schema, "schema": schema, "table": name},
                "op": "c",
                "ts_ms": 1
            }),
        )
        .to_string();
        let record = Record {
            topic: &settings.kafka.topic,
            partition: 0,
            offset: 0,
            key: Some(key.as_bytes()),
            value: Some(value.as_bytes()),
        };
        match decoder.decode(&record) {
            Decision::Trigger(t) => assert_eq!(t.id, 7),
            other => {
                panic!("{f}: the decoder does not trigger on the connector's insert: {other:?}")
            }
        }
    }
}

// ---------------------------------------------------------------- a running sidecar

/// The metric families with at least one sample, and which are histograms.
fn exported(scrape: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let samples: BTreeSet<&str> = scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let mut families = BTreeSet::new();
    let mut histograms = BTreeSet::new();
    for l in scrape.lines() {
        let Some((name, kind)) = l.strip_prefix("# TYPE ").and_then(|t| t.split_once(' ')) else {
            continue;
        };
        let series: &[&str] = if kind == "histogram" {
            histograms.insert(name.to_owned());
            &["_bucket", "_sum", "_count"]
        } else {
            &[""]
        };
        if series
            .iter()
            .any(|s| samples.contains(format!("{name}{s}").as_str()))
        {
            families.insert(name.to_owned());
        }
    }
    (families, histograms)
}

/// The family of a series name: a histogram's `_bucket`, `_sum` and
/// `_count` belong to the histogram.
fn family<'n>(name: &'n str, histograms: &BTreeSet<String>) -> &'n str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| {
            name.strip_suffix(s)
                .filter(|base| histograms.contains(*base))
        })
        .unwrap_or(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_and_dashboard_use_only_metrics_the_sidecar_exports() {
    let referenced: BTreeSet<String> = rule_exprs()
        .iter()
        .chain(&dashboard_exprs())
        .flat_map(|e| metric_names(e))
        .collect();
    assert!(
        referenced.contains("outbox_events_failed"),
        "{referenced:?}"
    );

    let t = spawn_app(Options::default()).await;
    let id = t.insert("accounts.purchase_create", json!({})).await;
    t.wait_status(id, Status::Sent, Duration::from_secs(30))
        .await;

    // Scrape where the ServiceMonitor scrapes.
    let monitor = manifest("ServiceMonitor");
    let metrics_url = t.admin_url(str_of(
        &seq(&monitor["spec"]["endpoints"])[0]["path"],
        "endpoint path",
    ));
    // Some series appear late: the lag with librdkafka's statistics (every
    // 5 s), the histogram with the first dispatch.
    let what = format!("the sidecar to export {referenced:?}");
    let (families, histograms) = eventually(&what, Duration::from_secs(60), || {
        let url = metrics_url.clone();
        let referenced = &referenced;
        async move {
            let r = reqwest::get(&url).await.ok()?;
            if !r.status().is_success() {
                return None;
            }
            let (families, histograms) = exported(&r.text().await.ok()?);
            let done = referenced
                .iter()
                .all(|n| families.contains(family(n, &histograms)));
            done.then_some((families, histograms))
        }
    })
    .await;
    for name in &referenced {
        assert!(
            families.contains(family(name, &histograms)),
            "{name} is used in deploy/ but not exported"
        );
        assert!(
            !histograms.contains(name),
            "{name} is a histogram: query its _bucket, _sum or _count"
        );
    }

    // The probes answer where the Deployment sends them, and the variant
    // documented in deploy/README.md (a readinessProbe on /readyz) too.
    let pod = deployment_pod();
    let c = container(&pod, SIDECAR);
    let mut paths = vec![str_of(&c["livenessProbe"]["httpGet"]["path"], "probe path")];
    paths.extend(c["readinessProbe"]["httpGet"]["path"].as_str());
    paths.push("/readyz");
    for path in paths {
        let url = t.admin_url(path);
        let status = reqwest::get(&url).await.expect("probe").status();
        assert!(status.is_success(), "{url}: {status}");
    }
}

// ---------------------------------------------------------------- schemas

/// Runs `kubernetes-validate` (PyPI) when it is installed; the Rust tests
/// never require it. `KUBERNETES_VALIDATE` may name the executable.
#[test]
fn manifests_pass_kubernetes_validate_when_installed() {
    let exe = std::env::var_os("KUBERNETES_VALIDATE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|dir| dir.join("kubernetes-validate"))
                .find(|p| p.is_file())
        });
    let Some(exe) = exe else {
        use std::io::Write;
        let _ = std::io::stderr().write_all(b"deploy: kubernetes-validate not installed (pip install kubernetes-validate); schema check skipped\n");
        return;
    };
    // Native sidecars (an init container with restartPolicy) need 1.29.
    let manifests: Vec<PathBuf> = files(KUBERNETES, &["yaml", "yml"])
        .iter()
        .filter(|f| !f.ends_with("kustomization.yaml"))
        .map(|f| path(f))
        .collect();
    let out = std::process::Command::new(&exe)
        .args(["--strict", "--quiet", "--kubernetes-version", "1.29"])
        .args(&manifests)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", exe.display()));
    assert!(
        out.status.success(),
        "kubernetes-validate: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Static membership: each pod joins the group under its own stable
/// `group.instance.id` (its name), so a restart within the session timeout
/// does not rebalance the whole group.
#[test]
fn the_sidecar_joins_the_group_with_a_static_member_id_from_the_pod_name() {
    let pod = deployment_pod();
    let c = container(&pod, SIDECAR);
    let env = seq(&c["env"]);
    let var = env
        .iter()
        .find(|e| e["name"].as_str() == Some("OUTBOX__KAFKA__PROPERTIES__GROUP_INSTANCE_ID"))
        .expect("group.instance.id is set");
    assert_eq!(
        var["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.name")
    );
    assert_eq!(
        outbox_sidecar::config::property_name("group_instance_id"),
        "group.instance.id",
        "the environment spelling reaches librdkafka under its own name"
    );
}

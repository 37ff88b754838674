//! The Ray routes a history answers without its tables: what it can say about metrics,
//! profiling, Serve and the rest of a cluster that is gone.

use serde_json::{Value as Json, json};

use super::RAY_VERSION;
use super::body::state_envelope;
use super::route::FixedRoute;
use crate::config::GrafanaUrl;

/// Routes answered without the tables: what a history can say about metrics, profiling, Serve
/// and the rest of a cluster that is gone. With `grafana` configured, Ray's metrics pages frame
/// it ([`super::grafana`]).
pub(super) fn fixed_answer(route: FixedRoute, session: &str, grafana: Option<&GrafanaUrl>) -> Json {
    let ok = |msg: &str, data: Json| json!({"result": true, "msg": msg, "data": data});
    match route {
        FixedRoute::ClusterMetadata => ok(
            "",
            json!({"rayVersion": RAY_VERSION, "pythonVersion": "", "rayInitCluster": false}),
        ),
        // Ray answers its server's zone; a history has no server whose zone matters, and
        // Ray's "unknown" answer makes the page show times in the viewer's own zone (or the
        // one they picked).
        FixedRoute::Timezone => json!({"offset": null, "value": null}),
        FixedRoute::Version => json!({"version": "4", "ray_version": RAY_VERSION,
            "ray_commit": "", "session_name": session}),
        FixedRoute::AuthenticationMode => json!({"authentication_mode": "disabled"}),
        FixedRoute::Authenticate => ok("Authentication is not needed for a history.", json!({})),
        FixedRoute::UsageStats => ok(
            "Fetched usage stats enabled",
            json!({"usageStatsEnabled": false, "usageStatsPromptEnabled": false}),
        ),
        FixedRoute::ProfilingEnabled => ok("", json!({"profilingEnabled": false})),
        FixedRoute::RuntimeEnvRedaction => ok("", json!({"redactionEnabled": true})),
        FixedRoute::GrafanaHealth => match grafana {
            Some(grafana) => super::grafana::health(grafana, session),
            // "Disabled" hides the metrics cards instead of showing an error.
            None => ok("Grafana disabled", json!({"grafanaHost": "DISABLED"})),
        },
        // Without Grafana, as a cluster without Prometheus answers (with 500,
        // [`answered_as_failure`]): the metrics and Serve pages then say to set up Prometheus
        // and Grafana instead of framing Grafana's disabled host.
        FixedRoute::PrometheusHealth => match grafana {
            Some(_) => ok("prometheus running", json!({})),
            None => json!({"result": false,
                "msg": "prometheus healthcheck failed.",
                "data": {"reason": "a history kept by Afterglow has no Prometheus"}}),
        },
        FixedRoute::ServeApplications => json!({"controller_info": {}, "proxies": {},
            "applications": {}, "target_capacity": null}),
        FixedRoute::Datasets => json!({"datasets": []}),
        FixedRoute::ObjectSummary => state_envelope(
            0,
            0,
            0,
            json!({"node_id_to_summary": {"cluster": {"summary": {}, "total_objects": 0,
                "total_size_mb": 0.0, "callsite_enabled": true, "summary_by": "callsite"}}}),
            Vec::new(),
        ),
    }
}

/// Whether Ray answers `route` with 500: Prometheus's health, which a live cluster without
/// Prometheus fails, when no Grafana is configured.
pub(super) fn answered_as_failure(route: FixedRoute, grafana: Option<&GrafanaUrl>) -> bool {
    route == FixedRoute::PrometheusHealth && grafana.is_none()
}

//! Ray's metrics over the history: the Grafana of `AFTERGLOW_GRAFANA_URL`, framed over the
//! session's time range.
//!
//! Ray's Metrics page frames `{grafanaHost}/d/{uid}/?…&refresh=5s&from=now-5m&to=now` (its Serve
//! pages single panels under `d-solo/`): a live cluster's last minutes. Afterglow names
//! [`GRAFANA_HOST`] as the host, a relative one, so a frame asks Ray's dashboard, whose proxy asks
//! Afterglow; every path under it is answered with a page that sends the frame on to the same
//! path of the configured Grafana, from the session's first event to its last, without refresh.
//! A page, not a redirect: Ray's proxy follows redirects itself, and would fetch Grafana from
//! its own server instead of letting the browser go there.

use serde_json::{Value as Json, json};

use super::missing_page::escaped;
use crate::config::GrafanaUrl;
use crate::tables::manifest::SessionStats;

/// The `grafanaHost` Ray's pages are given: relative, so their frames ask Ray's dashboard, and
/// through its proxy Afterglow's `grafana/…` route.
pub(super) const GRAFANA_HOST: &str = "grafana";

/// Ray's own dashboards' ids (`dashboard/modules/metrics`), for those the URL does not name.
const DEFAULT_DASHBOARD: &str = "rayDefaultDashboard";

/// `api/grafana_health` with Grafana configured, as a cluster whose Grafana is running answers.
pub(super) fn health(grafana: &GrafanaUrl, session: &str) -> Json {
    json!({"result": true, "msg": "Grafana running", "data": {
        "grafanaHost": GRAFANA_HOST,
        "grafanaOrgId": org_id(grafana),
        "sessionName": session,
        "dashboardUids": {
            "default": grafana.dashboard_uid().unwrap_or(DEFAULT_DASHBOARD),
            "serve": "rayServeDashboard",
            "serveDeployment": "rayServeDeploymentDashboard",
            "data": "rayDataDashboard",
        },
        "dashboardDatasource": "Prometheus",
        "grafanaClusterFilter": null,
    }})
}

/// The organization of the configured URL (`orgId=`), Ray's default (`1`) when it names none.
fn org_id(grafana: &GrafanaUrl) -> String {
    let query = grafana
        .as_str()
        .split_once('?')
        .map_or("", |(_, query)| query);
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(name, _)| name == "orgId")
        .map_or_else(|| "1".to_owned(), |(_, value)| value.into_owned())
}

/// The page answering `grafana/{path}` with `pairs` (the frame's query): it sends the frame on
/// to `{path}` of the configured Grafana over the session's time range (`stats`' first to last
/// event, where known), without refresh, for `session`.
pub(super) fn frame(
    grafana: &GrafanaUrl,
    path: &str,
    pairs: &[(String, String)],
    session: &str,
    stats: Option<&SessionStats>,
) -> Vec<u8> {
    let target = target(grafana, path, pairs, session, stats);
    let target = escaped(&target);
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"0; url={target}\">\
         <title>Afterglow: this session in Grafana</title></head><body>\n\
         <p><a href=\"{target}\">This session in Grafana</a></p>\n</body></html>\n"
    )
    .into_bytes()
}

/// The Grafana URL a frame of `path` with `pairs` is sent on to (see [`frame`]).
fn target(
    grafana: &GrafanaUrl,
    path: &str,
    pairs: &[(String, String)],
    session: &str,
    stats: Option<&SessionStats>,
) -> String {
    let span = stats.and_then(|stats| stats.first_ms.zip(stats.last_ms));
    let replaced = |name: &str| match name {
        "refresh" | "var-SessionName" => true,
        "from" | "to" => span.is_some(),
        _ => false,
    };
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs.iter().filter(|(name, _)| !replaced(name)) {
        query.append_pair(name, value);
    }
    if let Some((first, last)) = span {
        query.append_pair("from", &first.to_string());
        query.append_pair("to", &last.to_string());
    }
    query.append_pair("var-SessionName", session);
    let path = path.trim_start_matches('/');
    format!("{}/{path}?{}", grafana.server(), query.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(query: &str) -> Vec<(String, String)> {
        url::form_urlencoded::parse(query.as_bytes())
            .map(|(name, value)| (name.into_owned(), value.into_owned()))
            .collect()
    }

    #[test]
    fn a_frame_goes_to_the_configured_grafana_over_the_session() -> Result<(), &'static str> {
        let grafana = GrafanaUrl::new("https://g.example.com/d/abc?orgId=3")?;
        let stats = SessionStats {
            first_ms: Some(1_000),
            last_ms: Some(9_000),
            ..SessionStats::default()
        };
        // The query Ray's Metrics page builds for its frame.
        let asked = pairs(
            "orgId=3&theme=light&kiosk=1&refresh=5s&from=now-5m&to=now&timezone=UTC\
             &var-SessionName=s&var-datasource=Prometheus",
        );
        let sent = target(&grafana, "d/abc/", &asked, "session_1", Some(&stats));
        assert_eq!(
            sent,
            "https://g.example.com/d/abc/?orgId=3&theme=light&kiosk=1&timezone=UTC\
             &var-datasource=Prometheus&from=1000&to=9000&var-SessionName=session_1"
        );
        // A session whose times are unknown keeps the frame's own range.
        let kept = target(
            &grafana,
            "d-solo/abc",
            &pairs("from=now-1h&to=now"),
            "s",
            None,
        );
        assert_eq!(
            kept,
            "https://g.example.com/d-solo/abc?from=now-1h&to=now&var-SessionName=s"
        );
        let page =
            String::from_utf8_lossy(&frame(&grafana, "d/abc/", &asked, "s", None)).into_owned();
        assert!(
            page.contains("url=https://g.example.com/d/abc/?orgId=3&amp;theme=light"),
            "{page}"
        );
        Ok(())
    }

    #[test]
    fn grafanas_health_names_the_relative_host_and_the_urls_dashboard() -> Result<(), &'static str>
    {
        let named = health(
            &GrafanaUrl::new("https://g.example.com/d/abc?orgId=3")?,
            "s",
        );
        assert_eq!(named["data"]["grafanaHost"], "grafana");
        assert_eq!(named["data"]["grafanaOrgId"], "3");
        assert_eq!(named["data"]["dashboardUids"]["default"], "abc");
        assert_eq!(named["data"]["sessionName"], "s");
        let server = health(&GrafanaUrl::new("https://g.example.com")?, "s");
        assert_eq!(server["data"]["grafanaOrgId"], "1");
        assert_eq!(
            server["data"]["dashboardUids"]["default"],
            "rayDefaultDashboard"
        );
        Ok(())
    }
}

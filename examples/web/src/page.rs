//! The page: finds WebGPU, draws each row into the table as it is judged, and publishes the
//! report as `window.attnReport` (the browser test waits for it).

use js_sys::{Function, JSON, Promise, Reflect};
use runtime::{Gpu, kernels};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{Document, Element, Window};

use crate::{DEFAULT_SEQ, MAX_SEQ, Report, Row, run_layer};

const NO_WEBGPU: &str = "This browser has no WebGPU: navigator.gpu is undefined. Use a \
    recent browser with WebGPU enabled (on Linux, Chromium needs --enable-unsafe-webgpu).";

/// Runs the page; `index.html` calls it once the module is loaded.
#[wasm_bindgen]
pub async fn run() -> Result<(), JsValue> {
    std::panic::set_hook(Box::new(|info| {
        web_sys::console::error_1(&info.to_string().into());
    }));
    let window = web_sys::window().ok_or("the page has no window")?;
    let document = window.document().ok_or("the page has no document")?;
    let report = match seq_from(&window) {
        Err(e) => failed(e),
        Ok(_) if !has_webgpu(&window)? => failed(NO_WEBGPU.into()),
        Ok(seq) => run_rows(&window, &document, seq).await,
    };
    show_summary(&document, &report)?;
    let json = serde_json::to_string(&report).map_err(|e| e.to_string())?;
    Reflect::set(&window, &"attnReport".into(), &JSON::parse(&json)?)?;
    Ok(())
}

fn failed(error: String) -> Report {
    Report {
        error: Some(error),
        ..Report::default()
    }
}

/// The sequence length from `?seq=N`, else [`DEFAULT_SEQ`].
fn seq_from(window: &Window) -> Result<u32, String> {
    let search = window.location().search().unwrap_or_default();
    let given = search
        .trim_start_matches('?')
        .split('&')
        .find_map(|kv| kv.strip_prefix("seq="));
    match given {
        None => Ok(DEFAULT_SEQ),
        Some(text) => match text.parse::<u32>() {
            Ok(seq) if (1..=MAX_SEQ).contains(&seq) => Ok(seq),
            _ => Err(format!("?seq={text}: give a length from 1 to {MAX_SEQ}")),
        },
    }
}

fn has_webgpu(window: &Window) -> Result<bool, JsValue> {
    Ok(!Reflect::get(&window.navigator(), &"gpu".into())?.is_undefined())
}

async fn run_rows(window: &Window, document: &Document, seq: u32) -> Report {
    let gpu = match Gpu::new(kernels::FAMILY.iter().copied()).await {
        Ok(gpu) => gpu,
        Err(e) => return failed(format!("No WebGPU device: {e}")),
    };
    let adapter = adapter_label(window).await;
    set_text(document, "adapter", &format!("Adapter: {adapter}"));
    set_text(document, "status", "Running…");
    let body = document.get_element_by_id("rows");
    let drawn = run_layer(&gpu, seq, |row| {
        if let Some(body) = &body
            && let Err(e) = append_row(document, body, row)
        {
            web_sys::console::error_1(&e);
        }
    })
    .await;
    match drawn {
        Ok(rows) => Report {
            adapter: Some(adapter),
            rows,
            error: None,
        },
        Err(e) => Report {
            adapter: Some(adapter),
            ..failed(e.to_string())
        },
    }
}

/// `vendor architecture description` of the browser's adapter, which wgpu's adapter name
/// (the description alone) often leaves empty.
async fn adapter_label(window: &Window) -> String {
    let info = async {
        let gpu = Reflect::get(&window.navigator(), &"gpu".into())?;
        let request: Function = Reflect::get(&gpu, &"requestAdapter".into())?.dyn_into()?;
        let adapter = JsFuture::from(Promise::from(request.call0(&gpu)?)).await?;
        let info = Reflect::get(&adapter, &"info".into())?;
        let field = |name: &str| Reflect::get(&info, &name.into()).ok()?.as_string();
        let parts: Vec<String> = ["vendor", "architecture", "description"]
            .iter()
            .filter_map(|n| field(n))
            .filter(|s| !s.is_empty())
            .collect();
        Ok::<_, JsValue>(parts.join(" "))
    };
    match info.await {
        Ok(label) if !label.is_empty() => format!("{label} (WebGPU)"),
        _ => "unnamed WebGPU adapter".into(),
    }
}

fn append_row(document: &Document, body: &Element, row: &Row) -> Result<(), JsValue> {
    let tr = document.create_element("tr")?;
    tr.set_class_name(if row.pass { "pass" } else { "fail" });
    let cells = [
        row.kernel.clone(),
        row.shape.clone(),
        format!(
            "{} {:.2e} ≤ {:.2e} ({:.0}%)",
            row.output,
            row.error,
            row.bound,
            100.0 * row.error / row.bound
        ),
        if row.pass { "pass" } else { "FAIL" }.to_string(),
        format!("{:.1} ms", row.ms),
    ];
    for text in cells {
        let td = document.create_element("td")?;
        td.set_text_content(Some(&text));
        tr.append_child(&td)?;
    }
    body.append_child(&tr)?;
    Ok(())
}

fn show_summary(document: &Document, report: &Report) -> Result<(), JsValue> {
    let summary = format!("{} passed, {} failed", report.passed(), report.failed());
    set_text(document, "status", &summary);
    if report.adapter.is_none() {
        set_text(document, "adapter", "Adapter: none");
    }
    if let Some(error) = &report.error {
        let p = document
            .get_element_by_id("error")
            .ok_or("the page has no #error")?;
        p.set_text_content(Some(error));
    }
    Ok(())
}

fn set_text(document: &Document, id: &str, text: &str) {
    if let Some(e) = document.get_element_by_id(id) {
        e.set_text_content(Some(text));
    }
}

//! `#[derive(Metrics)]` for the status structs of `cosched-status`: each field that a Prometheus
//! metric is taken from says so beside it, with the metric's name, type and help, as scx's
//! `#[stat(desc = ...)]` does:
//!
//! ```text
//! #[derive(Metrics)]
//! pub struct VmBwStats {
//!     #[metric(counter, name = "cosched_vm_membw_throttled_seconds_total", unit = "ns",
//!              help = "Time held back for memory bandwidth ...")]
//!     pub throttled_ns: u64,
//! }
//! ```
//!
//! The derive writes `impl Metrics for VmBwStats { const METRICS: &[Metric<Self>] = ... }`: one
//! entry per `#[metric]`, in field order. Keys of `#[metric(...)]`:
//! - `counter`, `gauge` or `histogram` (first), `name`, `help`;
//! - `unit = "ns" | "us" | "ms"`: the field's unit, divided down to seconds;
//! - `by = "label"`: the field yields several samples (a map by its keys, quantiles), each with
//!   this label;
//! - `labels = "k=\"v\""`: labels every sample carries after its container's;
//! - `value = path`: a `fn(&Self) -> T` the samples are taken from instead of the field (a figure
//!   derived from several fields);
//! - `absent = 0`: for an `Option` field, the value while it is `None` (a counter not yet counted).

use proc_macro::TokenStream;
use quote::quote;
use syn::{parse_macro_input, Data, DeriveInput, Fields, LitStr};

#[proc_macro_derive(Metrics, attributes(metric))]
pub fn derive_metrics(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// One `#[metric(...)]`.
struct Spec {
    kind: syn::Ident,
    name: LitStr,
    help: LitStr,
    labels: Option<LitStr>,
    by: Option<LitStr>,
    unit: Option<LitStr>,
    value: Option<syn::Path>,
    absent: Option<syn::Lit>,
}

fn expand(input: &DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(&input.ident, "Metrics: only structs"));
    };
    let Fields::Named(fields) = &data.fields else {
        return Err(syn::Error::new_spanned(&input.ident, "Metrics: only structs with named fields"));
    };
    let mut entries = Vec::new();
    for f in &fields.named {
        let field = f.ident.as_ref().expect("named");
        for attr in f.attrs.iter().filter(|a| a.path().is_ident("metric")) {
            entries.push(entry(field, &parse_spec(attr)?)?);
        }
    }
    let ident = &input.ident;
    Ok(quote! {
        impl ::cosched_status::metric::Metrics for #ident {
            const METRICS: &'static [::cosched_status::metric::Metric<Self>] = &[#(#entries),*];
        }
    })
}

fn parse_spec(attr: &syn::Attribute) -> syn::Result<Spec> {
    let (mut kind, mut name, mut help) = (None, None, None);
    let mut spec = Spec {
        kind: syn::Ident::new("Counter", proc_macro2::Span::call_site()),
        name: LitStr::new("", proc_macro2::Span::call_site()),
        help: LitStr::new("", proc_macro2::Span::call_site()),
        labels: None,
        by: None,
        unit: None,
        value: None,
        absent: None,
    };
    attr.parse_nested_meta(|meta| {
        let p = &meta.path;
        for (word, variant) in [("counter", "Counter"), ("gauge", "Gauge"), ("histogram", "Histogram")] {
            if p.is_ident(word) {
                kind = Some(syn::Ident::new(variant, proc_macro2::Span::call_site()));
                return Ok(());
            }
        }
        if p.is_ident("name") {
            name = Some(meta.value()?.parse::<LitStr>()?);
        } else if p.is_ident("help") {
            help = Some(meta.value()?.parse::<LitStr>()?);
        } else if p.is_ident("labels") {
            spec.labels = Some(meta.value()?.parse()?);
        } else if p.is_ident("by") {
            spec.by = Some(meta.value()?.parse()?);
        } else if p.is_ident("unit") {
            let unit: LitStr = meta.value()?.parse()?;
            if !["ns", "us", "ms"].contains(&unit.value().as_str()) {
                return Err(syn::Error::new_spanned(unit, "unit: \"ns\", \"us\" or \"ms\""));
            }
            spec.unit = Some(unit);
        } else if p.is_ident("value") {
            spec.value = Some(meta.value()?.parse()?);
        } else if p.is_ident("absent") {
            spec.absent = Some(meta.value()?.parse()?);
        } else {
            return Err(meta.error("metric: unknown key"));
        }
        Ok(())
    })?;
    let missing = |what: &str| syn::Error::new_spanned(attr, format!("metric: {what} missing"));
    spec.kind = kind.ok_or_else(|| missing("counter, gauge or histogram"))?;
    spec.name = name.ok_or_else(|| missing("name"))?;
    spec.help = help.ok_or_else(|| missing("help"))?;
    Ok(spec)
}

fn entry(field: &syn::Ident, s: &Spec) -> syn::Result<proc_macro2::TokenStream> {
    let Spec { kind, name, help, .. } = s;
    let labels = s.labels.as_ref().map_or(String::new(), LitStr::value);
    let by = s.by.as_ref().map_or(String::new(), LitStr::value);
    let value = match (&s.value, &s.absent) {
        (Some(_), Some(a)) => return Err(syn::Error::new_spanned(a, "metric: value and absent exclude each other")),
        (Some(f), None) => quote! { #f(s) },
        (None, Some(a)) => quote! { s.#field.unwrap_or(#a) },
        (None, None) => quote! { s.#field },
    };
    let divisor = match s.unit.as_ref().map(LitStr::value).as_deref() {
        Some("ns") => quote! { 1e9 },
        Some("us") => quote! { 1e6 },
        Some("ms") => quote! { 1e3 },
        _ => quote! { 1.0 },
    };
    Ok(quote! {
        ::cosched_status::metric::Metric {
            name: #name,
            kind: ::cosched_status::metric::Kind::#kind,
            help: #help,
            labels: #labels,
            by: #by,
            samples: |s: &Self, out: &mut dyn FnMut(&str, &str, f64)| {
                ::cosched_status::metric::Sample::each(&#value, #by, &mut |suffix: &str, labels: &str, v: f64| {
                    out(suffix, labels, v / #divisor)
                })
            },
        }
    })
}

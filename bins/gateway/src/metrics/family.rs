//! The shapes a metric family of [`metrics`](crate::metrics) takes, each declared once with
//! everything that names it (name, help, labels, label values, buckets) and able to register
//! itself and to forget the series of a removed (upstream, model) or model.
//!
//! A family is one field of the `families!` list in `metrics.rs`; that list generates the
//! struct, its constructor, its registration (in the order of the list, which is the order of the
//! exposition) and its forgetting. So adding a family is one line there plus its uses.

use std::fmt;

use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::metrics::TargetLabels;

/// What every declared family does besides counting: register itself, and drop the series of
/// an (upstream, model) or a model a reload removed (a no-op for families without those labels).
pub(crate) trait Declared {
    /// Registers the family in `registry` under its name and help.
    fn register(&self, registry: &mut Registry);

    /// Drops the series of one (upstream, model).
    fn forget_target(&self, _labels: &TargetLabels) {}

    /// Drops the series of one model.
    fn forget_model(&self, _model: &str) {}
}

/// The labels of a [`TargetCounters`] series: `upstream`, `model`, then the family's own label.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(crate) struct ValueLabels {
    target: TargetLabels,
    label: &'static str,
    value: &'static str,
}

impl EncodeLabelSet for ValueLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), fmt::Error> {
        [
            ("upstream", self.target.upstream.as_str()),
            ("model", self.target.model.as_str()),
            (self.label, self.value),
        ]
        .encode(encoder)
    }
}

/// A counter family over (upstream, model) and one more label whose values are fixed: every
/// (upstream, model) gets all of them, at zero, when it is resolved.
#[derive(Debug, Clone)]
pub(crate) struct TargetCounters<const N: usize> {
    name: &'static str,
    help: &'static str,
    label: &'static str,
    /// The label's values, in the order [`TargetCounters::resolve`] returns their counters.
    pub(crate) values: [&'static str; N],
    family: Family<ValueLabels, Counter>,
}

impl<const N: usize> TargetCounters<N> {
    /// Declares the family `slotgate_{name}_total` with `label` taking `values`.
    pub(crate) fn declare(
        name: &'static str,
        help: &'static str,
        label: &'static str,
        values: [&'static str; N],
    ) -> Self {
        Self {
            name,
            help,
            label,
            values,
            family: Family::default(),
        }
    }

    /// The counters of one (upstream, model), in [`TargetCounters::values`] order.
    pub(crate) fn resolve(&self, target: &TargetLabels) -> [Counter; N] {
        self.values.map(|value| {
            self.family.get_or_create_owned(&ValueLabels {
                target: target.clone(),
                label: self.label,
                value,
            })
        })
    }
}

impl<const N: usize> Declared for TargetCounters<N> {
    fn register(&self, registry: &mut Registry) {
        registry.register(self.name, self.help, self.family.clone());
    }

    fn forget_target(&self, target: &TargetLabels) {
        for value in self.values {
            self.family.remove(&ValueLabels {
                target: target.clone(),
                label: self.label,
                value,
            });
        }
    }
}

/// A histogram family over (upstream, model).
#[derive(Debug, Clone)]
pub(crate) struct TargetHistograms {
    name: &'static str,
    help: &'static str,
    family: Family<TargetLabels, Histogram, fn() -> Histogram>,
}

impl TargetHistograms {
    /// Declares the family `slotgate_{name}` with the buckets `buckets` makes.
    pub(crate) fn declare(
        name: &'static str,
        help: &'static str,
        buckets: fn() -> Histogram,
    ) -> Self {
        Self {
            name,
            help,
            family: Family::new_with_constructor(buckets),
        }
    }

    /// The histogram of one (upstream, model).
    pub(crate) fn resolve(&self, target: &TargetLabels) -> Histogram {
        self.family.get_or_create_owned(target)
    }
}

impl Declared for TargetHistograms {
    fn register(&self, registry: &mut Registry) {
        registry.register(self.name, self.help, self.family.clone());
    }

    fn forget_target(&self, target: &TargetLabels) {
        self.family.remove(target);
    }
}

/// The labels of a [`ModelCounters`] series: `model`, then the family's own label.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(crate) struct ModelLabels {
    model: String,
    label: &'static str,
    value: &'static str,
}

impl EncodeLabelSet for ModelLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), fmt::Error> {
        [("model", self.model.as_str()), (self.label, self.value)].encode(encoder)
    }
}

/// A counter family over a model and one more label: the first `N` values exist for every
/// model from the start (at 0, resolved once), any other appears when first counted.
#[derive(Debug, Clone)]
pub(crate) struct ModelCounters<const N: usize> {
    name: &'static str,
    help: &'static str,
    label: &'static str,
    values: [&'static str; N],
    /// The values that appear only when first counted (still forgotten with the model).
    rare: &'static [&'static str],
    family: Family<ModelLabels, Counter>,
}

impl<const N: usize> ModelCounters<N> {
    /// Declares the family `slotgate_{name}_total` with `label` taking `values` (present from
    /// the start) and `rare` (present once counted).
    pub(crate) fn declare(
        name: &'static str,
        help: &'static str,
        label: &'static str,
        values: [&'static str; N],
        rare: &'static [&'static str],
    ) -> Self {
        Self {
            name,
            help,
            label,
            values,
            rare,
            family: Family::default(),
        }
    }

    /// The counters of one model's first `N` values, in declaration order.
    pub(crate) fn resolve(&self, model: &str) -> [Counter; N] {
        self.values.map(|value| self.counter(model, value))
    }

    /// Counts one under (`model`, `value`): the slow path, it hashes its labels.
    pub(crate) fn count(&self, model: &str, value: &'static str) {
        self.counter(model, value).inc();
    }

    fn counter(&self, model: &str, value: &'static str) -> Counter {
        self.family.get_or_create_owned(&ModelLabels {
            model: model.to_owned(),
            label: self.label,
            value,
        })
    }
}

impl<const N: usize> Declared for ModelCounters<N> {
    fn register(&self, registry: &mut Registry) {
        registry.register(self.name, self.help, self.family.clone());
    }

    fn forget_model(&self, model: &str) {
        for value in self.values.iter().chain(self.rare) {
            self.family.remove(&ModelLabels {
                model: model.to_owned(),
                label: self.label,
                value,
            });
        }
    }
}

/// A counter family over one label whose values all exist from the start, at zero, so a
/// `rate()` or an alert over any of them needs no `absent()`.
#[derive(Debug, Clone)]
pub(crate) struct Counters<const N: usize> {
    name: &'static str,
    help: &'static str,
    label: &'static str,
    values: [&'static str; N],
    family: Family<[(&'static str, &'static str); 1], Counter>,
}

impl<const N: usize> Counters<N> {
    /// Declares the family `slotgate_{name}_total` with `label` taking `values`.
    pub(crate) fn declare(
        name: &'static str,
        help: &'static str,
        label: &'static str,
        values: [&'static str; N],
    ) -> Self {
        let this = Self {
            name,
            help,
            label,
            values,
            family: Family::default(),
        };
        for value in values {
            let _ = this.counter(value);
        }
        this
    }

    /// The counter of one of the values, for the code that counts it to keep.
    pub(crate) fn counter(&self, value: &'static str) -> Counter {
        debug_assert!(self.values.contains(&value), "{value} is not declared");
        self.family.get_or_create_owned(&[(self.label, value)])
    }
}

impl<const N: usize> Declared for Counters<N> {
    fn register(&self, registry: &mut Registry) {
        registry.register(self.name, self.help, self.family.clone());
    }
}

/// A histogram without labels.
#[derive(Debug, Clone)]
pub(crate) struct Single {
    name: &'static str,
    help: &'static str,
    /// The histogram, for the code that observes into it to keep.
    pub(crate) histogram: Histogram,
}

impl Single {
    /// Declares the histogram `slotgate_{name}` with `buckets`.
    pub(crate) fn declare(name: &'static str, help: &'static str, buckets: Histogram) -> Self {
        Self {
            name,
            help,
            histogram: buckets,
        }
    }
}

impl Declared for Single {
    fn register(&self, registry: &mut Registry) {
        registry.register(self.name, self.help, self.histogram.clone());
    }
}

/// `slotgate_build_info`: 1, labelled with this build's version, OS and architecture.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BuildInfo;

impl Declared for BuildInfo {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "build",
            "This build of slotgate",
            Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION")),
                ("os", std::env::consts::OS),
                ("arch", std::env::consts::ARCH),
            ]),
        );
    }
}

//! The gateways behind the tier seam ([`lmcache_tier_spec::adapter`]):
//! the `s3_bucket` tiers of one cascade, their specs checked before
//! anything starts, their gateways started before the server
//! ([`Gateways::start`]), which gets its tiers pointed at them and the
//! per-launch key in its environment.

use lmcache_tier_spec::adapter::{RunningTiers, StartContext, TierAdapter};
use lmcache_tier_spec::Cascade;

use crate::spec;
use crate::{GatewayError, Gateways, GatewaysView};

/// The gateways of one cascade's `s3_bucket` tiers.
#[derive(Debug)]
pub struct GatewayTiers {
    cascade: Cascade,
}

impl GatewayTiers {
    /// The `s3_bucket` tiers of `cascade` (the server's tiers, in cascade
    /// order; every other tier is left to the server as written).
    pub fn of(cascade: &Cascade) -> Self {
        Self {
            cascade: cascade.clone(),
        }
    }
}

impl TierAdapter for GatewayTiers {
    type Error = GatewayError;
    type Running = Gateways;

    /// The checks of the whole cascade that read nothing but the specs: no
    /// `s3` tier signs with the per-launch key by accident
    /// ([`spec::check_default_chain`]), and no two bucket tiers share a
    /// prefix ([`spec::check_overlapping_prefixes`]). Each tier's keys,
    /// credentials and bucket are checked by its start.
    fn check(&self) -> Result<(), GatewayError> {
        spec::check_default_chain(self.cascade.tiers().iter())?;
        spec::check_overlapping_prefixes(self.cascade.tiers())?;
        Ok(())
    }

    /// [`Gateways::start`], with the server's environment as the source of
    /// the credential variables.
    async fn start(self, context: &StartContext<'_>) -> Result<Gateways, GatewayError> {
        let (_, gateways) = Gateways::start(&self.cascade, context.env, context.node_dir).await?;
        Ok(gateways)
    }
}

impl RunningTiers for Gateways {
    type View = GatewaysView;
    type Error = GatewayError;

    /// Each `s3_bucket` tier pointed at its gateway ([`Gateways::point_tiers`]).
    fn server_tiers(&self, cascade: &mut Cascade) {
        self.point_tiers(cascade);
    }

    fn server_env(&self) -> Vec<(&'static str, Option<String>)> {
        Gateways::server_env(self)
    }

    fn view(&self) -> GatewaysView {
        Gateways::view(self)
    }

    fn stop(self) {
        drop(self);
    }
}

//! What an overlay's lowers are: the image's layer directories (`plan`), or its composefs
//! metadata image over the store's objects (`composefs`).

pub mod composefs;
pub mod plan;

use lamina_image::Digest;
use lamina_store::Store;
use lamina_sys::Mounter;

use crate::RootfsError;
use crate::choose::Choice;

/// Makes the lowers `choice` needs ready once the layers are in the store (the caller
/// holds the layers-in-use lock): a composefs image mounted. `auto`'s composefs is never
/// built here: if its image is gone (collected since) or fails to mount, the create
/// falls back to the layers, so a damaged image never fails a default create.
pub(crate) fn prepare(
    store: &Store,
    mounter: &dyn Mounter,
    chain_ids: &[Digest],
    choice: Choice,
) -> Result<Choice, RootfsError> {
    if !choice.model.composefs() {
        return Ok(choice);
    }
    if choice.named {
        composefs::mounted(store, mounter, chain_ids)?;
        return Ok(choice);
    }
    let top = chain_ids.last().expect("an image has layers");
    match composefs::mounted_if_built(store, mounter, top) {
        Ok(Some(_)) => Ok(choice),
        Ok(None) => composefs::auto::over_the_layers(
            store,
            chain_ids,
            choice,
            &RootfsError::Refused("collected since".into()),
        ),
        Err(e) => composefs::auto::over_the_layers(store, chain_ids, choice, &e),
    }
}

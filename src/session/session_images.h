#pragma once
// Sessions on an image (API.md "Images"): what the session manager does with a spec's `image`
// and `read_only_rootfs` — check the backend can, resolve the reference to a stored image
// (pulling it on first use), give the box its image root, remove the session's root layer with
// the session.
//
// A session's root layers live under <data_dir>/rootfs/<id>/: upper+work (read_only_rootfs
// false: the session's writable root, kept across suspend, resume and restarts), or ro-upper +
// ro-work (a read-only root: only the box's mountpoints and /etc identity files, made afresh
// at every start).

#include <string>

#include "common/error.h"
#include "image/store.h"
#include "sandbox/sandbox.h"
#include "session/session_manager.h"
#include "session/template_manager.h"

namespace agentbox::session {

// ENOTSUP naming `image` (or `read_only_rootfs`) and the backend when `backend` cannot make an
// image root, or when read_only_rootfs false is asked without an image.
Status check_image_spec(const SessionSpec& spec, const sandbox::Backend& backend,
                        const std::string& backend_name);

// check_image_spec for the backend `spec` will get (its own, the default runner's, the daemon's
// default), before anything is pulled for it.
Status check_image_backend(const ManagerConfig& config, const SessionSpec& spec);

// A session on a template built on an image (template_manager.h SnapshotInfo::image_digest):
// sets spec's image to that snapshot's (ref and digest: the digest is kept, whatever the ref
// names since). EINVAL naming `image` when the session asks for another image. Nothing to do
// otherwise (an unknown template is the create's error, under the manager's lock).
Status template_image(TemplateManager* templates, SessionSpec* spec);

// The daemon's default image (ManagerConfig::default_image: seed 003's docker mode) for a spec
// that names no image and no template, when the backend it will get makes image roots.
void default_image(const ManagerConfig& config, SessionSpec* spec);

// Sets spec->image_digest from spec->image_ref: the stored image of that ref or digest, else
// pulled now (blocking). ENOTSUP without an image store. Nothing to do without image_ref; with
// image_digest already set (template_image), checks the image is stored.
Status resolve_image(image::ImageStore* images, SessionSpec* spec);

// Fills cfg's root_* fields for a session on an image (nothing otherwise) and puts the image's
// Env under what cfg->env holds. ENOENT when the image was removed.
Status image_box_config(image::ImageStore* images, const std::string& data_dir,
                        const std::string& id, const SessionSpec& spec, sandbox::BoxConfig* cfg);

// Fills cfg's root_* fields for a box on image `img` whose upper and work dirs are made (owned
// by the layers' id base) as `upper` and `work` in `dir`, and puts the image's Env under what
// cfg->env holds. What image_box_config does for a session; a template build (writable, its
// user acting for the image's root through cfg->root_owner) calls it too.
Status image_root_config(image::ImageStore& images, const image::Image& img, const std::string& dir,
                         const std::string& upper, const std::string& work, bool writable,
                         sandbox::BoxConfig* cfg);

// Removes <data_dir>/rootfs/<id> (the session is gone).
void remove_image_root(const std::string& data_dir, const std::string& id);

}  // namespace agentbox::session

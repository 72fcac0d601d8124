// placeholder until the module lands
namespace agentbox::linux_ns {}

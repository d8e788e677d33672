"""The buffers of a module that holds a DistributedOptimizer's parameters
(BatchNorm's running statistics), named as in the state_dict() of the module
named_parameters came from: every worker builds the same model, so the names
agree."""


def named_buffers(module, names_by_param, keep):
    """[(name, buffer)] of `module`'s buffers for which keep(buffer) holds,
    or None where the module holds none of the parameters in
    `names_by_param` (id(parameter) -> its name)."""
    local = {id(p): n for n, p in module.named_parameters()}
    prefix = None
    for pid, n in local.items():
        name = names_by_param.get(pid)
        if name is not None and name.endswith(n):
            prefix = name[:len(name) - len(n)]
            break
    if prefix is None:
        return None
    return [(prefix + n, b) for n, b in module.named_buffers() if keep(b) and id(b) not in names_by_param]

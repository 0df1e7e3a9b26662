def check_multi_head(factory, convention="auto"):
    raise NotImplementedError

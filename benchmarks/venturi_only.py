def targets(report):
    return ""
